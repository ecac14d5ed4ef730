// Package strictjson is the one strict reader of untrusted JSON documents
// (the bootstrap and oac-sandbox-io's private file, the control API's
// commands, the image manifest): it walks a document's tokens along a
// Schema and refuses what encoding/json lets through, which matches keys
// case-insensitively and keeps the last of repeated keys. It finds, in
// document order, the first of: malformed JSON, a key repeated in one
// object (escaped or not), a key that is known only in another letter
// case, an unknown key, a missing required key, a value of the wrong JSON
// type, an array longer than its bound, nesting deeper than MaxDepth, and
// anything after the value but white space.
//
// It owns only that walk; callers decode the values with encoding/json
// afterwards and turn an *Error into their own errors (their sentinels,
// their wording). It must not echo input: an Error names the rule, the
// path and, for key problems, the key (callers bound and sanitize it).
package strictjson
