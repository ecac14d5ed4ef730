// Package egress is the guest side of the sandbox's only way out: an HTTP
// proxy and a SOCKS5 proxy on 127.0.0.1 inside the guest, and the proxy
// environment (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY, both cases)
// the daemon gets.
//
// Every client connection becomes one egress stream to the host whose
// header names the target exactly as the client gave it; no byte of the
// client's payload is sent before the host's answer says yes. The HTTP
// proxy serves CONNECT for any port (TLS, websockets, any long-lived
// stream), forwards absolute-form http:// requests with keep-alive (one
// stream per target, reused while the client keeps the connection), and
// turns a refusal into an explicit response: 403 with X-Sandbox-Egress:
// denied, the reason and the rule, and a body saying it is policy, not a
// network fault, so retrying will not help (RefusalResponse gives the
// same response to the capture of package transparent). SOCKS5 (CONNECT,
// no authentication) sends domain names to the host unresolved and answers
// a refusal with the matching reply code. The agent may wrap the Opener
// (transparent.Pool.Opener) so an address its resolver made up names its
// name again.
//
// It owns parsing of client requests, which is bounded: request heads at
// most MaxHeaderBytes, a deadline on every head and handshake, a cap on
// concurrent client connections. It must not resolve names (the host
// decides and resolves; the guest's own resolver, for programs that ignore
// proxies, is package transparent), decide policy, or log payloads.
package egress
