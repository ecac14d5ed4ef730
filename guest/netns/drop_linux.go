package netns

import (
	"encoding/binary"
	"fmt"
	"net"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// DropOthers deletes every interface of the agent's own network namespace
// but lo (a veth deletes its peer with it), so that neither the workload
// nor the agent has a network: for a guest the host reaches over its
// transport alone (`oac-guest --offline`, a Kubernetes Pod, whose network
// the cluster gives whether it is wanted or not). It needs CAP_NET_ADMIN
// only, where making a namespace of the workload's own needs
// CAP_SYS_ADMIN. It returns the interfaces it deleted.
func DropOthers() ([]string, error) {
	others, err := Others()
	if err != nil || len(others) == 0 {
		return nil, err
	}
	c, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
	if err != nil {
		return nil, fmt.Errorf("drop the guest's interfaces: %w", err)
	}
	defer c.Close()
	var dropped []string
	for _, name := range others {
		i, err := net.InterfaceByName(name)
		if err != nil {
			continue // gone with its peer
		}
		// struct ifinfomsg: family, pad, type, index, flags, change.
		msg := make([]byte, 16)
		binary.NativeEndian.PutUint32(msg[4:8], uint32(i.Index))
		_, err = c.Execute(netlink.Message{
			Header: netlink.Header{Type: unix.RTM_DELLINK, Flags: netlink.Request | netlink.Acknowledge},
			Data:   msg,
		})
		if err != nil {
			return dropped, fmt.Errorf("drop the guest's interface %s: %w", name, err)
		}
		dropped = append(dropped, name)
	}
	if left, err := Others(); err != nil || len(left) > 0 {
		return dropped, fmt.Errorf("drop the guest's interfaces: %v still there (%v)", left, err)
	}
	return dropped, nil
}
