package journal

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func line(seq uint64) []byte {
	// Every line is as long as every other, whatever its seq.
	return fmt.Appendf(nil, `{"event":"log","seq":%d,"line":"%s"}`+"\n", seq, strings.Repeat("x", 40-len(fmt.Sprint(seq))))
}

func writeLines(t *testing.T, w *Writer, from, to uint64) {
	t.Helper()
	for s := from; s <= to; s++ {
		require.NoError(t, w.Write(s, line(s)))
	}
}

// drain reads until io.EOF: the seqs given, and the gaps as "gap A-B".
func drain(t *testing.T, r *Reader) []string {
	t.Helper()
	var got []string
	for {
		it, err := r.Next()
		if errors.Is(err, io.EOF) {
			return got
		}
		require.NoError(t, err)
		if it.Gap.To != 0 {
			got = append(got, fmt.Sprintf("gap %d-%d", it.Gap.From, it.Gap.To))
			continue
		}
		require.Equal(t, line(it.Seq), it.Line, "a line comes back as written")
		got = append(got, fmt.Sprint(it.Seq))
	}
}

func seqs(from, to uint64) []string {
	var s []string
	for i := from; i <= to; i++ {
		s = append(s, fmt.Sprint(i))
	}
	return s
}

func small(t *testing.T, dir string) *Writer {
	t.Helper()
	w, err := Create(dir)
	require.NoError(t, err)
	// 10 lines of 70 bytes a segment, 3 segments.
	w.SegmentBytes, w.Segments = int64(10*len(line(1))), 3
	t.Cleanup(func() { w.Close() })
	return w
}

func TestAReaderReplaysFromTheFirstKeptLineOrFromASeq(t *testing.T) {
	dir := t.TempDir()
	w := small(t, dir)
	writeLines(t, w, 1, 25)
	assert.Equal(t, seqs(1, 25), drain(t, Open(dir, 0)))
	assert.Equal(t, seqs(17, 25), drain(t, Open(dir, 17)), "from a seq in the newest segment")
	assert.Equal(t, seqs(4, 25), drain(t, Open(dir, 4)), "from a seq in the oldest segment")
	assert.Empty(t, drain(t, Open(dir, 26)), "from the next line: nothing yet")
}

func TestTheJournalKeepsItsBoundAndDropsTheOldestSegmentWhole(t *testing.T) {
	dir := t.TempDir()
	w := small(t, dir)
	writeLines(t, w, 1, 95)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var total int64
	var names []string
	for _, e := range ents {
		st, err := e.Info()
		require.NoError(t, err)
		total += st.Size()
		names = append(names, e.Name())
		assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	}
	assert.Equal(t, []string{segName(71), segName(81), segName(91)}, names)
	assert.LessOrEqual(t, total, int64(w.Segments)*w.SegmentBytes)
	assert.Equal(t, seqs(71, 95), drain(t, Open(dir, 0)), "the default is the oldest line kept, no gap")
}

func TestASeqOlderThanTheJournalKeepsIsReportedAsAGap(t *testing.T) {
	dir := t.TempDir()
	w := small(t, dir)
	writeLines(t, w, 1, 95)
	got := drain(t, Open(dir, 5))
	assert.Equal(t, append([]string{"gap 5-70"}, seqs(71, 95)...), got)
}

func TestAReaderFollowsTheWriterAcrossSegments(t *testing.T) {
	dir := t.TempDir()
	w := small(t, dir)
	writeLines(t, w, 1, 3)
	r := Open(dir, 2)
	assert.Equal(t, seqs(2, 3), drain(t, r))
	writeLines(t, w, 4, 24) // two new segments
	assert.Equal(t, seqs(4, 24), drain(t, r))
	writeLines(t, w, 25, 25)
	assert.Equal(t, seqs(25, 25), drain(t, r))
}

func TestASlowReaderGetsWhatItOpenedAndAGapForWhatWasDroppedMeanwhile(t *testing.T) {
	dir := t.TempDir()
	w := small(t, dir)
	writeLines(t, w, 1, 5)
	r := Open(dir, 0)
	it, err := r.Next()
	require.NoError(t, err)
	assert.Equal(t, uint64(1), it.Seq)
	writeLines(t, w, 6, 60) // segments 1-10 (open), 11-20 and 21-30 dropped
	assert.Equal(t, append(append(seqs(2, 10), "gap 11-30"), seqs(31, 60)...), drain(t, r))
}

func TestOpenAtEndGivesOnlyLinesWrittenAfterIt(t *testing.T) {
	dir := t.TempDir()
	w := small(t, dir)
	writeLines(t, w, 1, 12)
	r, err := OpenAtEnd(dir)
	require.NoError(t, err)
	assert.Empty(t, drain(t, r))
	writeLines(t, w, 13, 14)
	assert.Equal(t, seqs(13, 14), drain(t, r))
}

type tornHere struct{}

func TestATornFinalLineIsNotALineAndIsReportedWhenTheWriterIsGone(t *testing.T) {
	dir := t.TempDir()
	w := small(t, dir)
	writeLines(t, w, 1, 4)
	w.TearNext(func() { panic(tornHere{}) })
	func() {
		defer func() { require.IsType(t, tornHere{}, recover()) }()
		_ = w.Write(5, line(5))
	}()
	r := Open(dir, 0)
	assert.Equal(t, seqs(1, 4), drain(t, r), "the lines before the torn one, whole")
	assert.Equal(t, len(line(5))/2, r.Torn(), "what the writer left of line 5")
	assert.Zero(t, r.Damaged())
}

func TestALineCompletedLaterIsReadWhole(t *testing.T) {
	dir := t.TempDir()
	w := small(t, dir)
	writeLines(t, w, 1, 1)
	// A reader that looks while the writer is half way through line 2.
	f, err := os.OpenFile(filepath.Join(dir, segName(1)), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	defer f.Close()
	l := line(2)
	_, err = f.Write(l[:9])
	require.NoError(t, err)
	r := Open(dir, 0)
	assert.Equal(t, seqs(1, 1), drain(t, r))
	_, err = f.Write(l[9:])
	require.NoError(t, err)
	assert.Equal(t, seqs(2, 2), drain(t, r))
	assert.Zero(t, r.Torn())
}

func TestDamagedLinesAreSkippedAndTheirSeqsReportedAsAGap(t *testing.T) {
	dir := t.TempDir()
	body := string(line(1)) +
		`{"event":"log","seq":2,"li` + "\n" + // cut short and a newline after
		"not json at all\n" +
		`{"event":"log"}` + "\n" + // no seq
		`{"event":"log","seq":0}` + "\n" +
		`{"event":"log","seq":1}` + "\n" + // not above the last
		`[1,2]` + "\n" +
		string(line(3)) +
		`{"seq":4} {"seq":5}` + "\n" + // two values
		strings.Repeat("y", MaxLine+10) + "\n" + // over the bound
		string(line(6))
	require.NoError(t, os.WriteFile(filepath.Join(dir, segName(1)), []byte(body), 0o600))
	r := Open(dir, 0)
	assert.Equal(t, []string{"1", "gap 2-2", "3", "gap 4-5", "6"}, drain(t, r))
	assert.Equal(t, 8, r.Damaged())
}

func TestALineOverTheBoundIsLeftOutAndItsSeqIsAGap(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir)
	require.NoError(t, err)
	defer w.Close()
	require.NoError(t, w.Write(1, line(1)))
	big := append([]byte(`{"seq":2,"line":"`+strings.Repeat("z", MaxLine)), "\"}\n"...)
	assert.Error(t, w.Write(2, big))
	require.NoError(t, w.Write(3, line(3)))
	assert.Equal(t, []string{"1", "gap 2-2", "3"}, drain(t, Open(dir, 0)))
}

func TestCreateRemovesAnEarlierRunsSegmentsAndNothingElse(t *testing.T) {
	dir := t.TempDir()
	w := small(t, dir)
	writeLines(t, w, 1, 15)
	w.Close()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "shim.json"), []byte("{}"), 0o600))
	w2, err := Create(dir)
	require.NoError(t, err)
	defer w2.Close()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	assert.Equal(t, []string{segName(1), "shim.json"}, names, "the new journal's first segment, empty, and what is not a segment")
	assert.True(t, Exists(dir), "a journal is there before its first line")
	assert.Empty(t, drain(t, Open(dir, 0)))
	require.NoError(t, w2.Write(1, line(1)))
	assert.Equal(t, seqs(1, 1), drain(t, Open(dir, 0)))
}

func TestSegmentNamesAreParsedStrictly(t *testing.T) {
	assert.True(t, IsSegment(segName(1)))
	for _, n := range []string{"events-1.jsonl", "events-" + strings.Repeat("0", 20) + ".jsonl", "events-" + strings.Repeat("9", 20) + ".jsonl",
		"x" + segName(1), segName(1) + ".tmp", "lock", "shim.json", "events-0000000000000000000a.jsonl"} {
		assert.False(t, IsSegment(n), n)
	}
}
