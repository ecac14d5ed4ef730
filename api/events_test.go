package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lineSeqs reads the seq of every line b holds, in order.
func lineSeqs(t *testing.T, b []byte) []uint64 {
	t.Helper()
	var seqs []uint64
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var v struct {
			Seq   *uint64 `json:"seq"`
			Event string  `json:"event"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &v), "line %q", sc.Text())
		require.NotNil(t, v.Seq, "line %q carries no seq", sc.Text())
		seqs = append(seqs, *v.Seq)
	}
	return seqs
}

func TestJSONLinesNumbersEventsAndAnswersFromOne(t *testing.T) {
	var b bytes.Buffer
	j := NewJSONLines(&b)
	j.Emit(Event{Event: KindState, State: StateStarting})
	require.NoError(t, j.Encode(Answer{Event: KindAnswer, ID: "1", Command: CmdStatus, OK: true}))
	require.NoError(t, j.Encode(&Answer{Event: KindAnswer, ID: "2", Command: CmdStop, OK: true}))
	j.Emit(Event{Event: KindState, State: StateStopped, Seq: 99})
	assert.Equal(t, []uint64{1, 2, 3, 4}, lineSeqs(t, b.Bytes()), "the sink numbers every line, whatever the caller set")
}

func TestJSONLinesNumbersLinesInTheOrderTheyAreWrittenUnderConcurrency(t *testing.T) {
	var b bytes.Buffer
	j := NewJSONLines(&b)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				j.Emit(Event{Event: KindLog, Line: "x"})
				_ = j.Encode(Answer{Event: KindAnswer, OK: true})
			}
		}()
	}
	wg.Wait()
	seqs := lineSeqs(t, b.Bytes())
	require.Len(t, seqs, 1600)
	for i, s := range seqs {
		require.Equal(t, uint64(i+1), s, "line %d", i+1)
	}
}

func TestJSONLinesLeavesOtherValuesUnnumbered(t *testing.T) {
	var b bytes.Buffer
	j := NewJSONLines(&b)
	require.NoError(t, j.Encode(map[string]int{"a": 1}))
	j.Emit(Event{Event: KindState})
	assert.Equal(t, "{\"a\":1}\n", b.String()[:8])
	assert.Contains(t, b.String(), `"seq":1`)
}

func TestATapGetsEveryNumberedLineAsWritten(t *testing.T) {
	var b bytes.Buffer
	j := NewJSONLines(&b)
	var tapped bytes.Buffer
	var seqs []uint64
	j.Tap(func(seq uint64, line []byte) { seqs = append(seqs, seq); tapped.Write(line) })
	j.Emit(Event{Event: KindState, State: StateStarting})
	require.NoError(t, j.Encode(map[string]int{"a": 1}))
	require.NoError(t, j.Encode(Answer{Event: KindAnswer, OK: true}))
	assert.Equal(t, []uint64{1, 2}, seqs)
	assert.Equal(t, strings.Replace(b.String(), "{\"a\":1}\n", "", 1), tapped.String(), "the numbered lines, byte for byte")
}
