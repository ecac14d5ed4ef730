package crashpoint

// Outcome is what the next command on the name finds after a crash at a
// point.
type Outcome string

const (
	// Before: the sandbox as it was before the crashed command (a kept
	// sandbox still starts with what it kept; a throwaway name is free).
	Before Outcome = "before"
	// Nothing: nothing of the sandbox is left on the host.
	Nothing Outcome = "nothing"
	// Done: the crashed command's work is complete (it died only before
	// saying so).
	Done Outcome = "done"
)

// EnvVar names the point a crash build kills itself at.
const EnvVar = "OAC_CRASH_AT"

// Point is one named step. Only this package makes them.
type Point struct {
	name     string
	commands []string
	leaves   Outcome
	step     string
}

// Name is the point's name, "COMMAND/STEP".
func (p Point) Name() string { return p.name }

// Commands are the oac-shim commands that pass the point.
func (p Point) Commands() []string { return p.commands }

// Leaves is what the next command finds after a crash at the point.
func (p Point) Leaves() Outcome { return p.leaves }

// Step says what has been done when the point is reached.
func (p Point) Step() string { return p.step }

var points []Point

func declare(name string, commands []string, leaves Outcome, step string) Point {
	p := Point{name: name, commands: commands, leaves: leaves, step: step}
	points = append(points, p)
	return p
}

// Points returns every declared point, in the order of the commands'
// steps.
func Points() []Point { return append([]Point(nil), points...) }

var (
	create = []string{"create"}
	start  = []string{"start"}
	boots  = []string{"run", "start"}
	reset  = []string{"reset"}
	destr  = []string{"destroy"}
	run    = []string{"run"}
)

// The points. A kept sandbox's record is written before anything of the
// provider is made and says "creating", "resetting" or "destroying" until
// the command is done; the next command finds such a record with its lock
// free and discards the sandbox.
var (
	CreateLocked        = declare("create/locked", create, Nothing, "the name's lock is held and its directory exists; no record yet")
	CreateRecordWritten = declare("create/record-written", create, Nothing, `the record says "creating"; the provider has made nothing`)
	CreateProviderState = declare("create/provider-state", create, Nothing, "the provider made the sandbox (runtime state directory, container, distribution, disk) and holds it")
	CreateReleased      = declare("create/released", create, Nothing, `the provider released its runtime hold; the record still says "creating"`)
	CreateRecorded      = declare("create/recorded", create, Done, `the record says "created"; create has not yet said so`)

	RunLocked = declare("run/locked", run, Before, "the name's lock is held in the keep root (no kept sandbox has the name); nothing of the provider made")

	StartClaimed      = declare("start/claimed", start, Before, "the lock is held and the record read")
	StartRecorded     = declare("start/recorded-running", start, Before, `the record says "running"; nothing booted`)
	BootCreated       = declare("boot/provider-created", boots, Before, "the provider made the sandbox's instance; the guest has not started")
	BootStarted       = declare("boot/runtime-started", boots, Before, "the provider started the sandbox's runtime (a process, a container, a VM, a Pod, a claim bound to a warm Pod); the guest has not connected")
	BootReady         = declare("boot/ready", boots, Before, "the guest is ready and the ready event written")
	WarmWaiting       = declare("warm/waiting", run, Before, "a warm sandbox (run --warm): the guest is connected and the warm event written; nothing of a tenant's exists")
	ClaimMounted      = declare("claim/mounted", run, Before, "a warm sandbox's claim brought volumes: they are mounted in the guest (its own mount namespace, nothing on the host), the bootstrap not yet taken")
	ClaimTaken        = declare("claim/taken", run, Before, "a warm sandbox was claimed: the tenant's policy and forwards are in force, the bootstrap not yet sent")
	StopInstanceEnded = declare("stop/instance-ended", boots, Before, "the sandbox stopped and its instance is destroyed; the record (start) still says \"running\"")

	// An outliving shim's (--outlive-parent) journal: oac-shim attach
	// reads what a killed shim wrote, a torn final line included.
	OutliveTornLine = declare("outlive/torn-line", run, Before, "the guest is ready (--outlive-parent) and the journal holds the first half of the ready event's line, which stdout never got")

	ResetMarked        = declare("reset/marked", reset, Nothing, `the record says "resetting"`)
	ResetDiscarded     = declare("reset/discarded", reset, Nothing, "the provider's kept state is discarded")
	ResetProviderState = declare("reset/provider-state", reset, Nothing, "the provider made the sandbox afresh and holds it")
	ResetRecorded      = declare("reset/recorded", reset, Done, `the record says "created" again; reset has not yet said so`)

	DestroyMarked    = declare("destroy/marked", destr, Nothing, `the record says "destroying"`)
	DestroyDiscarded = declare("destroy/discarded", destr, Nothing, "the provider's kept state is discarded; the record is still there")
)
