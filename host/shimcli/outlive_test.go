package shimcli

import (
	"bytes"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gatedWriter blocks each Write until the test lets it through.
type gatedWriter struct {
	gate chan struct{}
	mu   sync.Mutex
	b    bytes.Buffer
	err  error
}

func (g *gatedWriter) Write(p []byte) (int, error) {
	<-g.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return 0, g.err
	}
	return g.b.Write(p)
}

func (g *gatedWriter) String() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.b.String()
}

func TestParentOutNeverBlocksTheShimAndDropsWhatOverflowsItsQueue(t *testing.T) {
	g := &gatedWriter{gate: make(chan struct{})}
	p := newParentOut(g)
	line := bytes.Repeat([]byte("x"), 1023)
	line = append(line, '\n')
	// The writer is stuck on the first line: the rest queue, up to the
	// bound, and every Write returns at once.
	n := 0
	for range 2 * maxParentQueue / len(line) {
		k, err := p.Write(line)
		require.NoError(t, err)
		require.Equal(t, len(line), k)
		n++
	}
	close(g.gate) // the parent reads again
	p.Close()
	got := g.String()
	assert.Less(t, len(got), n*len(line), "what overflowed the queue was dropped")
	assert.GreaterOrEqual(t, len(got), maxParentQueue-len(line), "what the queue held was written, whole lines")
	assert.Zero(t, len(got)%len(line))
}

func TestParentOutStopsWritingForGoodOnceTheParentIsGone(t *testing.T) {
	g := &gatedWriter{gate: make(chan struct{}), err: errors.New("broken pipe")}
	close(g.gate)
	p := newParentOut(g)
	_, err := p.Write([]byte("a\n"))
	require.NoError(t, err, "the shim never sees its parent's failure")
	p.Close() // the queued line was tried
	p.mu.Lock()
	assert.True(t, p.dead)
	p.mu.Unlock()
	_, err = p.Write([]byte("c\n"))
	assert.NoError(t, err)
}

func TestParentOutWritesEverythingInOrderToAParentThatReads(t *testing.T) {
	var b bytes.Buffer
	p := newParentOut(&b)
	var want bytes.Buffer
	for i := range 1000 {
		l := []byte{byte('a' + i%26), '\n'}
		want.Write(l)
		_, _ = p.Write(l)
	}
	p.Close()
	assert.Equal(t, want.String(), b.String())
}
