// Package egress is the guest side of the sandbox's only way out: the
// guest's one Exit, an HTTP proxy and a SOCKS5 proxy on 127.0.0.1 inside
// the guest, the proxy environment (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY,
// NO_PROXY, both cases, and OAC_EGRESS_REFUSALS) the daemon gets, and the
// list of recent refusals the workload may read.
//
// Every connection out of the guest, whichever program accepted it (the
// proxies here, the capture of package transparent), is an Attempt of the
// one Exit: it checks the target once (a host name or IP literal, a port
// in 1..65535), maps an address the guest's resolver made up back to its
// name, and tries the carriers in order (the agent wires them: the
// workload's socket handed to the host on the fd channel, a pair from it,
// a dialed data connection, a stream of the session). A carrier that
// cannot ask the host says so and the next is tried; one the host
// answered is never asked again. A new way out is one more Carrier in
// that list. No byte of the client's payload is sent before the host's
// answer says yes; the header names the target exactly as the client gave
// it, with the client's source port in the guest.
//
// The HTTP proxy serves CONNECT for any port (TLS, websockets, any
// long-lived stream), forwards absolute-form http:// requests with
// keep-alive (one stream per target, reused while the client keeps the
// connection), and turns a refusal into an explicit response: 403 with
// X-Sandbox-Egress: denied, the reason and the rule, and a body saying it
// is policy, not a network fault, so retrying will not help
// (RefusalResponse gives the same response to the capture of package
// transparent). SOCKS5 (CONNECT, no authentication) sends domain names to
// the host unresolved and answers a refusal with the matching reply code.
//
// Every refusal goes into Refusals (at most MaxRefusals, none older than
// RefusalAge): the target, the via, the client's source port, the code,
// its kind (policy, limit, request, network, sandbox), the rule and the
// reason. The HTTP proxy answers GET RefusalsPath in origin form with
// them as JSON, filtered by ?port= (the asker's own source port) and
// ?target=, so a raw TCP client that was reset can tell the policy from
// the network. Every workload process runs as one uid in one network
// namespace, so the guest cannot tell one program's connections from
// another's: the list holds only what the workload's own clients named
// and what the host answered them.
//
// It owns parsing of client requests, which is bounded: request heads at
// most MaxHeaderBytes, a deadline on every head and handshake, a cap on
// concurrent client connections. It must not resolve names (the host
// decides and resolves; the guest's own resolver, for programs that ignore
// proxies, is package transparent), decide policy, or log payloads.
package egress
