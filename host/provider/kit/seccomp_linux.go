package kit

import (
	"encoding/json"
	"fmt"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// nestedNamespace are the flags of the one clone the engine's default
// profile refuses and the agent needs: a launcher in a new user namespace
// (mapping the guest's ids to themselves) and a new mount namespace, where
// it masks oac-sandbox-io's private file before it drops to 1000:1000
// (package guest/workload). No other namespace flag is allowed with them.
const nestedNamespace = unix.CLONE_NEWUSER | unix.CLONE_NEWNS

// namespaceFlags are the clone flags the default profile looks at.
const namespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
	unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP

// launcherSyscalls are the calls the launcher makes inside that nested
// namespace, which the default profile allows only to holders of
// CAP_SYS_ADMIN: mounting the mask's tmpfs and binds and detaching it
// (mount, umount2), and the detached tmpfs that names oac-sandbox-io's
// undumpable copy (fsopen, fsconfig, fsmount). The agent holds no
// CAP_SYS_ADMIN, so in the container's own namespaces the kernel still
// refuses every one of them; they do something only in a user namespace
// of the guest's own, which the workload's own filter refuses to make.
var launcherSyscalls = []string{"fsconfig", "fsmount", "fsopen", "mount", "umount2"}

// ContainerSeccompProfile is the seccomp profile of a container that runs
// the agent (a docker container, a Kubernetes Pod's): the engine's default
// (the profile `docker run` applies without --security-opt seccomp) plus
// the nested namespace's clone and the launcher's calls (see
// docs/providers.md#docker). The engine resolves its conditions against
// the container's capabilities and the host's kernel as for its own.
func ContainerSeccompProfile() ([]byte, error) {
	p := seccomp.DefaultProfile()
	p.Syscalls = append(p.Syscalls,
		&seccomp.Syscall{
			LinuxSyscall: specs.LinuxSyscall{
				Names:  []string{"clone"},
				Action: specs.ActAllow,
				Args:   []specs.LinuxSeccompArg{{Index: 0, Value: namespaceFlags, ValueTwo: nestedNamespace, Op: specs.OpMaskedEqual}},
			},
			Comment:  "oac: the workload launcher's nested user and mount namespace",
			Excludes: &seccomp.Filter{Arches: []string{"s390", "s390x"}},
		},
		&seccomp.Syscall{
			LinuxSyscall: specs.LinuxSyscall{Names: launcherSyscalls, Action: specs.ActAllow},
			Comment:      "oac: the workload launcher's masks, inside its nested namespace",
		},
	)
	b, err := json.MarshalIndent(p, "", " ")
	if err != nil {
		return nil, fmt.Errorf("seccomp profile: %w", err)
	}
	return b, nil
}
