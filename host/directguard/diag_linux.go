package directguard

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// sock_diag's structures and attributes (include/uapi/linux/inet_diag.h,
// sock_diag.h); golang.org/x/sys does not carry them.
const (
	sizeofSockID  = 48 // struct inet_diag_sockid
	sizeofReqV2   = 8 + sizeofSockID
	sizeofDiagMsg = 4 + sizeofSockID + 20 // struct inet_diag_msg

	inetDiagReqSkBPFStorages = 2  // INET_DIAG_REQ_SK_BPF_STORAGES
	inetDiagSkBPFStorages    = 20 // INET_DIAG_SK_BPF_STORAGES

	allStates = 0xffffffff // every TCP state, TIME_WAIT and NEW_SYN_RECV too
)

// sockID is struct inet_diag_sockid: what names one socket to the kernel.
type sockID struct {
	SrcPort, DstPort uint16
	Src, Dst         [16]byte
	If               uint32
	Cookie           uint64
}

func (id sockID) put(b []byte) {
	binary.BigEndian.PutUint16(b[0:], id.SrcPort)
	binary.BigEndian.PutUint16(b[2:], id.DstPort)
	copy(b[4:20], id.Src[:])
	copy(b[20:36], id.Dst[:])
	binary.NativeEndian.PutUint32(b[36:], id.If)
	binary.NativeEndian.PutUint32(b[40:], uint32(id.Cookie))
	binary.NativeEndian.PutUint32(b[44:], uint32(id.Cookie>>32))
}

func getSockID(b []byte) sockID {
	var id sockID
	id.SrcPort = binary.BigEndian.Uint16(b[0:])
	id.DstPort = binary.BigEndian.Uint16(b[2:])
	copy(id.Src[:], b[4:20])
	copy(id.Dst[:], b[20:36])
	id.If = binary.NativeEndian.Uint32(b[36:])
	id.Cookie = uint64(binary.NativeEndian.Uint32(b[40:])) | uint64(binary.NativeEndian.Uint32(b[44:]))<<32
	return id
}

// diagEntry is one socket of a dump.
type diagEntry struct {
	Family, State uint8
	ID            sockID
	// Sealed: the socket carries the guard's socket storage.
	Sealed bool
}

// parseDiagMsg parses one SOCK_DIAG_BY_FAMILY answer: struct
// inet_diag_msg and its attributes. The socket carries storage of the map
// with ID mapID when INET_DIAG_SK_BPF_STORAGES names it.
func parseDiagMsg(b []byte, mapID uint32) (diagEntry, error) {
	if len(b) < sizeofDiagMsg {
		return diagEntry{}, fmt.Errorf("sock_diag answer of %d bytes, short of inet_diag_msg's %d", len(b), sizeofDiagMsg)
	}
	e := diagEntry{Family: b[0], State: b[1], ID: getSockID(b[4 : 4+sizeofSockID])}
	if e.Family != unix.AF_INET && e.Family != unix.AF_INET6 {
		return diagEntry{}, fmt.Errorf("sock_diag answer of family %d", e.Family)
	}
	attrs := b[sizeofDiagMsg:]
	if len(attrs) == 0 {
		return e, nil
	}
	ad, err := netlink.NewAttributeDecoder(attrs)
	if err != nil {
		return diagEntry{}, fmt.Errorf("sock_diag answer's attributes: %w", err)
	}
	for ad.Next() {
		if ad.Type() != inetDiagSkBPFStorages {
			continue
		}
		ad.Nested(func(stores *netlink.AttributeDecoder) error {
			for stores.Next() {
				if stores.Type() != unix.SK_DIAG_BPF_STORAGE {
					continue
				}
				stores.Nested(func(st *netlink.AttributeDecoder) error {
					for st.Next() {
						if st.Type() != unix.SK_DIAG_BPF_STORAGE_MAP_ID {
							continue
						}
						if b := st.Bytes(); len(b) == 4 && binary.NativeEndian.Uint32(b) == mapID {
							e.Sealed = true
						}
					}
					return st.Err()
				})
			}
			return stores.Err()
		})
	}
	if err := ad.Err(); err != nil {
		return diagEntry{}, fmt.Errorf("sock_diag answer's attributes: %w", err)
	}
	return e, nil
}

// diag asks the kernel about the TCP sockets of one network namespace
// (the one its socket was made in) and destroys some.
type diag struct {
	c *netlink.Conn
}

func openDiag() (*diag, error) {
	c, err := netlink.Dial(unix.NETLINK_SOCK_DIAG, nil)
	if err != nil {
		return nil, fmt.Errorf("direct mode needs sock_diag to abort its sockets: %w", err)
	}
	return &diag{c: c}, nil
}

func (d *diag) close() error { return d.c.Close() }

// dump lists every TCP socket of family, in every state; storageFD, when
// not negative, is a socket-storage map whose entries the answers name.
func (d *diag) dump(family uint8, storageFD int, mapID uint32) ([]diagEntry, error) {
	req := make([]byte, sizeofReqV2)
	req[0] = family
	req[1] = unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(req[4:], allStates)
	if storageFD >= 0 {
		ae := netlink.NewAttributeEncoder()
		ae.Nested(inetDiagReqSkBPFStorages, func(nae *netlink.AttributeEncoder) error {
			nae.Uint32(unix.SK_DIAG_BPF_STORAGE_REQ_MAP_FD, uint32(storageFD))
			return nil
		})
		attrs, err := ae.Encode()
		if err != nil {
			return nil, err
		}
		req = append(req, attrs...)
	}
	msgs, err := d.c.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.SOCK_DIAG_BY_FAMILY, Flags: netlink.Request | netlink.Dump},
		Data:   req,
	})
	if err != nil {
		return nil, fmt.Errorf("list the host's TCP sockets (sock_diag): %w", err)
	}
	out := make([]diagEntry, 0, len(msgs))
	for _, m := range msgs {
		if m.Header.Type != unix.SOCK_DIAG_BY_FAMILY {
			continue
		}
		e, err := parseDiagMsg(m.Data, mapID)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// destroy aborts one socket (tcp_abort: its peer gets a reset, a
// TIME_WAIT entry is dropped). The kernel matches the cookie too, so a
// socket that went away and was replaced is not touched: that and a
// socket already gone are errNoSocket.
func (d *diag) destroy(e diagEntry) error {
	req := make([]byte, sizeofReqV2)
	req[0] = e.Family
	req[1] = unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(req[4:], allStates)
	e.ID.put(req[8:])
	_, err := d.c.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.SOCK_DESTROY, Flags: netlink.Request | netlink.Acknowledge},
		Data:   req,
	})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESTALE) {
		return errNoSocket
	}
	return err
}

var errNoSocket = errors.New("no such socket")

// probeDestroy tells whether the kernel destroys sockets on request
// (CONFIG_INET_DIAG_DESTROY): asked about a socket that does not exist, it
// answers ENOENT when it does, EOPNOTSUPP when it does not.
func (d *diag) probeDestroy() error {
	err := d.destroy(diagEntry{Family: unix.AF_INET})
	if err == nil || errors.Is(err, errNoSocket) {
		return nil
	}
	if errors.Is(err, unix.EOPNOTSUPP) {
		return errors.New("direct mode cannot be guarded: the kernel cannot destroy sockets on request (it was built without CONFIG_INET_DIAG_DESTROY)")
	}
	return fmt.Errorf("direct mode cannot be guarded: asking the kernel to destroy a socket failed: %w", err)
}
