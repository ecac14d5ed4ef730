package oci

import "fmt"

// hostEtcFiles are the host /etc entries the default root shares read-only:
// TLS roots, the dynamic linker's cache, name service and time zone data
// (the bwrap provider's list).
var hostEtcFiles = []string{
	"ssl", "ca-certificates", "ca-certificates.conf", "alternatives",
	"ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf",
	"localtime", "timezone", "os-release", "protocols", "services", "mime.types",
}

// passwd and group list the identities every guest has.
func passwd() string {
	return "root:x:0:0:root:/root:/bin/sh\n" +
		fmt.Sprintf("runtime:x:%d:%d:runtime:/home/runtime:/bin/sh\n", 1000, 1000) +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
}

func group() string { return "root:x:0:\nruntime:x:1000:\nnogroup:x:65534:\n" }

// resolvConf points the guest at the agent's resolver on loopback
// (package guest/transparent); the same text as initsys.ResolvConf, which
// the agent checks before placing its own (it cannot here: no
// CAP_SYS_ADMIN for a bind mount).
const resolvConf = "# oac-guest: the guest's resolver; the host's egress policy decides every name\n" +
	"nameserver 127.0.0.1\noptions edns0\n"

func hosts(hostname string) string {
	s := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	if hostname != "" {
		s += "127.0.1.1\t" + hostname + "\n"
	}
	return s
}
