package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Result is one figure: a subject measured beside its baseline.
type Result struct {
	Name     string `json:"name"`
	Unit     string `json:"unit"`
	Subject  Stat   `json:"subject"`
	Baseline *Stat  `json:"baseline,omitempty"`
	// BaselineName says what the baseline is.
	BaselineName string `json:"baseline_name,omitempty"`
	// Ratio is Subject.Median / Baseline.Median.
	Ratio float64 `json:"ratio,omitempty"`
	Goal  string  `json:"goal,omitempty"`
	Holds *bool   `json:"holds,omitempty"`
	Note  string  `json:"note,omitempty"`
	// Group is the group (oac-bench -only) that measured it, where the
	// group tags its rows (those oac-bench -merge can replace).
	Group string `json:"group,omitempty"`
}

// NewResult builds a Result and computes its ratio.
func NewResult(name, unit string, subject []float64, baselineName string, baseline []float64) Result {
	r := Result{Name: name, Unit: unit, Subject: Summarise(subject)}
	if len(baseline) > 0 {
		b := Summarise(baseline)
		r.Baseline, r.BaselineName = &b, baselineName
		if b.Median != 0 {
			r.Ratio = r.Subject.Median / b.Median
		}
	}
	return r
}

// Judge records a goal and whether it holds.
func (r Result) Judge(goal string, holds bool) Result {
	r.Goal, r.Holds = goal, &holds
	return r
}

// Report is a whole run.
type Report struct {
	When time.Time `json:"when"`
	Host string    `json:"host"`
	// LoadStart and LoadEnd are /proc/loadavg's 1-minute figure when the
	// run started and when it was written: other work on the machine
	// moves every figure, ratios less (subject and baseline alternate).
	LoadStart string   `json:"load_start,omitempty"`
	LoadEnd   string   `json:"load_end,omitempty"`
	Results   []Result `json:"results"`
	Skipped   []string `json:"skipped,omitempty"`
	// Merged are the runs of some groups alone whose rows replaced
	// theirs in this report (oac-bench -only GROUPS -merge).
	Merged []MergedRun `json:"merged,omitempty"`

	group string // tags the rows Add records
}

// MergedRun is a run of some groups alone, merged into a report.
type MergedRun struct {
	Groups    []string  `json:"groups"`
	When      time.Time `json:"when"`
	LoadStart string    `json:"load_start,omitempty"`
	LoadEnd   string    `json:"load_end,omitempty"`
}

// NewReport starts a report describing this machine.
func NewReport() *Report {
	host := fmt.Sprintf("%s/%s, %d CPUs, %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version())
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				host += ", " + strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return &Report{When: time.Now().UTC().Truncate(time.Second), Host: host, LoadStart: loadAvg()}
}

// loadAvg is /proc/loadavg's 1-minute load average ("" where there is none).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// Add appends a result and prints it.
func (r *Report) Add(res Result) {
	if res.Group == "" {
		res.Group = r.group
	}
	r.Results = append(r.Results, res)
	fmt.Println(res.line())
}

// Skip records a figure that could not be measured here, and why.
func (r *Report) Skip(name, why string) {
	r.Skipped = append(r.Skipped, name+": "+why)
	fmt.Printf("skipped %s: %s\n", name, why)
}

func (res Result) line() string {
	s := fmt.Sprintf("%-48s %s %s", res.Name, fmtStat(res.Subject), res.Unit)
	if res.Baseline != nil {
		s += fmt.Sprintf("  vs %s %s  ratio %.2f", res.BaselineName, fmtStat(*res.Baseline), res.Ratio)
	}
	if res.Holds != nil {
		s += fmt.Sprintf("  [%s: %s]", res.Goal, verdict(*res.Holds))
	}
	if res.Note != "" {
		s += "  (" + res.Note + ")"
	}
	return s
}

func fmtStat(s Stat) string {
	return fmt.Sprintf("%s (%s..%s, n=%d)", fmtNum(s.Median), fmtNum(s.Min), fmtNum(s.Max), s.N)
}

func verdict(ok bool) string {
	if ok {
		return "holds"
	}
	return "MISSED"
}

// Write writes results.md and results.json into dir.
func (r *Report) Write(dir string) error {
	r.LoadEnd = loadAvg()
	return r.write(dir)
}

// Merge replaces, in the report in dir (results.json, and results.md
// written again from it), the rows of groups with this run's and records
// the run; the other rows stay as they were measured. It works for groups
// whose rows carry their group (Result.Group); a skipped figure belongs to
// a group when its text begins with the group's name.
func (r *Report) Merge(dir string, groups []string) error {
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		return err
	}
	var old Report
	if err := json.Unmarshal(b, &old); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, "results.json"), err)
	}
	in := func(g string) bool {
		for _, x := range groups {
			if strings.TrimSpace(x) == g {
				return true
			}
		}
		return false
	}
	var results []Result
	for _, res := range old.Results {
		if res.Group == "" || !in(res.Group) {
			results = append(results, res)
		}
	}
	old.Results = append(results, r.Results...)
	var skipped []string
	for _, s := range old.Skipped {
		g, _, _ := strings.Cut(s, ":")
		if f := strings.Fields(g); len(f) == 0 || !in(f[0]) {
			skipped = append(skipped, s)
		}
	}
	old.Skipped = append(skipped, r.Skipped...)
	var merged []MergedRun
	for _, m := range old.Merged {
		keep := false
		for _, g := range m.Groups {
			keep = keep || !in(g)
		}
		if keep {
			merged = append(merged, m)
		}
	}
	old.Merged = append(merged, MergedRun{Groups: groups, When: r.When, LoadStart: r.LoadStart, LoadEnd: loadAvg()})
	return old.write(dir)
}

func (r *Report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Benchmark results\n\n%s, on %s. Written by `make bench`; each figure is the median of\n", r.When.Format(time.RFC3339), r.Host)
	b.WriteString("repeated runs with (min..max), measured alternately with its baseline in the same run.")
	if r.LoadStart != "" {
		fmt.Fprintf(&b, " Load average (1 min) %s at the start, %s at the end.", r.LoadStart, r.LoadEnd)
	}
	for _, m := range r.Merged {
		g := strings.Join(m.Groups, ",")
		fmt.Fprintf(&b, "\n\nThe rows of `%s` are from a run of that group alone (`oac-bench -only %s -merge`), %s", g, g, m.When.Format(time.RFC3339))
		if m.LoadStart != "" {
			fmt.Fprintf(&b, ", load average (1 min) %s at its start and %s at its end", m.LoadStart, m.LoadEnd)
		}
		b.WriteString("; they replaced that group's rows and the rest is the full run's.")
	}
	b.WriteString("\n\n")
	b.WriteString("| figure | measured | unit | baseline | baseline measured | ratio | goal | holds |\n|---|---|---|---|---|---|---|---|\n")
	for _, res := range r.Results {
		base, bstat, ratio := "", "", ""
		if res.Baseline != nil {
			base, bstat, ratio = res.BaselineName, fmtStat(*res.Baseline), fmt.Sprintf("%.2f", res.Ratio)
		}
		holds := ""
		if res.Holds != nil {
			holds = verdict(*res.Holds)
		}
		name := res.Name
		if res.Note != "" {
			name += " (" + res.Note + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", name, fmtStat(res.Subject), res.Unit, base, bstat, ratio, res.Goal, holds)
	}
	if len(r.Skipped) > 0 {
		b.WriteString("\nNot measured here:\n\n")
		for _, s := range r.Skipped {
			fmt.Fprintf(&b, "- %s\n", s)
		}
	}
	return os.WriteFile(filepath.Join(dir, "results.md"), []byte(b.String()), 0o644)
}
