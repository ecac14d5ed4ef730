package manifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const hexA = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"

func valid() string {
	return `{"schema":1,"release":"2026.11.29-1","artifacts":[
 {"name":"rootfs-windows-amd64","kind":"rootfs-tar","platform":"windows","arch":"amd64",
  "url":"https://images.example.com/oac/rootfs.tar.gz","size":3,"sha256":"` + hexA + `"},
 {"name":"wsl","kind":"wsl-installer","platform":"windows","arch":"amd64",
  "url":"http://127.0.0.1:8080/wsl.msi","size":3,"sha256":"` + hexA + `"}]}`
}

func TestDecodeValid(t *testing.T) {
	m, err := Decode(strings.NewReader(valid()))
	require.NoError(t, err)
	assert.Equal(t, "2026.11.29-1", m.Release)
	require.Len(t, m.Artifacts, 2)
	assert.Equal(t, "rootfs.tar.gz", m.Artifacts[0].FileName())
	assert.Len(t, m.Find("", KindWSLInstaller, "windows", ""), 1)
	var buf bytes.Buffer
	require.NoError(t, Encode(m, &buf))
	again, err := Decode(&buf)
	require.NoError(t, err)
	assert.Equal(t, m, again)
}

func TestDecodeRefuses(t *testing.T) {
	v := valid()
	secretURL := "https://user:hunter2@images.example.com/x"
	for name, c := range map[string]struct{ doc, want string }{
		"unknown top key":     {strings.Replace(v, `"schema":1,`, `"schema":1,"extra":true,`, 1), `unknown key "extra"`},
		"case variant":        {strings.Replace(v, `"release"`, `"Release"`, 1), `unknown key "Release"`},
		"duplicate top key":   {strings.Replace(v, `"schema":1,`, `"schema":1,"schema":1,`, 1), `duplicate key "schema"`},
		"duplicate art key":   {strings.Replace(v, `"size":3,`, `"size":3,"size":4,`, 1), `artifact 0: duplicate key "size"`},
		"unknown art key":     {strings.Replace(v, `"size":3,`, `"size":3,"mirror":"x",`, 1), `artifact 0: unknown key "mirror"`},
		"missing key":         {strings.Replace(v, `"arch":"amd64",`, ``, 1), `artifact 0: missing key "arch"`},
		"trailing":            {v + ` {}`, "trailing data"},
		"trailing garbage":    {v + `x`, "trailing data"},
		"schema 2":            {strings.Replace(v, `"schema":1`, `"schema":2`, 1), "schema 2 is not supported"},
		"schema as string":    {strings.Replace(v, `"schema":1`, `"schema":"1"`, 1), "wrong type"},
		"not an object":       {`[]`, "top level must be an object"},
		"bad hex":             {strings.Replace(v, hexA, strings.ToUpper(hexA), 1), "sha256 must be 64 lowercase hex"},
		"zero size":           {strings.Replace(v, `"size":3`, `"size":0`, 1), "size must be"},
		"fraction size":       {strings.Replace(v, `"size":3`, `"size":3.5`, 1), "wrong type"},
		"plain http":          {strings.Replace(v, "https://images", "http://images", 1), "url must be https"},
		"user info":           {strings.Replace(v, "https://images.example.com/oac/rootfs.tar.gz", secretURL, 1), "no user info"},
		"query":               {strings.Replace(v, "rootfs.tar.gz", "rootfs.tar.gz?sig=1", 1), "no user info, query"},
		"unknown kind":        {strings.Replace(v, `"rootfs-tar"`, `"iso"`, 1), "kind must be one of"},
		"unknown platform":    {strings.Replace(v, `"platform":"windows"`, `"platform":"plan9"`, 1), "platform must be one of"},
		"duplicate name":      {strings.Replace(v, `"name":"wsl"`, `"name":"rootfs-windows-amd64"`, 1), "the name is used twice"},
		"same slot":           {strings.Replace(v, `"wsl-installer"`, `"rootfs-tar"`, 1), "is already pinned by"},
		"no artifacts":        {`{"schema":1,"release":"r","artifacts":[]}`, "want 1 to 256 artifacts"},
		"bad release":         {strings.Replace(v, `2026.11.29-1`, `a b`, 1), "release must be"},
		"deep nesting":        {strings.Replace(v, `"release":"2026.11.29-1"`, `"release":`+strings.Repeat("[", 40)+strings.Repeat("]", 40), 1), "nested too deeply"},
		"too large":           {strings.Repeat(" ", MaxSize+1), "larger than"},
		"truncated":           {v[:len(v)-3], "not valid JSON"},
		"artifacts not array": {`{"schema":1,"release":"r","artifacts":{}}`, "artifacts must be an array"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(strings.NewReader(c.doc))
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, err.Error(), c.want)
			assert.NotContains(t, err.Error(), "hunter2", "errors never echo a URL")
		})
	}
}

func TestVerifyFileAndLocate(t *testing.T) {
	dir := t.TempDir()
	content := []byte("abc")
	sum := sha256.Sum256(content)
	a := Artifact{Name: "x", URL: "https://h/p/file.bin", Size: 3, SHA256: hex.EncodeToString(sum[:])}
	_, err := Locate(a, "", []string{dir})
	require.ErrorIs(t, err, ErrMissing)
	p := filepath.Join(dir, "file.bin")
	require.NoError(t, os.WriteFile(p, content, 0o644))
	got, err := Locate(a, filepath.Join(dir, "store"), []string{dir})
	require.NoError(t, err)
	assert.Equal(t, p, got)
	require.NoError(t, VerifyFile(a, p))
	require.NoError(t, os.WriteFile(p, []byte("abd"), 0o644))
	assert.ErrorIs(t, VerifyFile(a, p), ErrDigest)
	require.NoError(t, os.WriteFile(p, []byte("abcd"), 0o644))
	assert.ErrorIs(t, VerifyFile(a, p), ErrWrongSize)
	assert.ErrorIs(t, VerifyFile(a, filepath.Join(dir, "none")), ErrMissing)
	store := filepath.Join(dir, "store")
	require.NoError(t, os.MkdirAll(filepath.Join(store, "sha256"), 0o755))
	require.NoError(t, os.WriteFile(StorePath(store, a.SHA256), content, 0o444))
	got, err = Locate(a, store, []string{dir})
	require.NoError(t, err)
	assert.Equal(t, StorePath(store, a.SHA256), got, "the store comes first")
}

func TestCheckURL(t *testing.T) {
	for _, ok := range []string{"https://a.example/x", "http://127.0.0.1:1/x", "http://[::1]/x", "http://localhost/x"} {
		assert.NoError(t, CheckURL(ok), ok)
	}
	for _, bad := range []string{"", "https://", "https://a/x#f", "https://a/x?", "https://a/ x", "file:///x", "http://10.0.0.1/x", "mailto:a@b", strings.Repeat("a", 3000)} {
		assert.Error(t, CheckURL(bad), bad)
	}
}

// withMirrorsAndInstall is valid() with two mirrors on the rootfs and an
// install plan on the WSL installer.
func withMirrorsAndInstall() string {
	v := strings.Replace(valid(), `"url":"https://images.example.com/oac/rootfs.tar.gz",`,
		`"url":"https://images.example.com/oac/rootfs.tar.gz","mirrors":["https://mirror-a.example.net/oac/rootfs.tar.gz","http://[::1]:8081/rootfs.tar.gz"],`, 1)
	return strings.Replace(v, `"url":"http://127.0.0.1:8080/wsl.msi","size":3,"sha256":"`+hexA+`"`,
		`"url":"http://127.0.0.1:8080/wsl.msi","size":3,"sha256":"`+hexA+`","install":{"args":["/passive","/norestart"],"restart":true}`, 1)
}

func TestMirrorsAndInstallDecodeAndRoundTrip(t *testing.T) {
	m, err := Decode(strings.NewReader(withMirrorsAndInstall()))
	require.NoError(t, err)
	assert.Equal(t, []string{"https://images.example.com/oac/rootfs.tar.gz", "https://mirror-a.example.net/oac/rootfs.tar.gz", "http://[::1]:8081/rootfs.tar.gz"},
		m.Artifacts[0].URLs(), "the url first, then the mirrors in order")
	assert.Equal(t, Install{Args: []string{"/passive", "/norestart"}, Restart: true}, m.Artifacts[1].InstallPlan())
	var buf bytes.Buffer
	require.NoError(t, Encode(m, &buf))
	again, err := Decode(&buf)
	require.NoError(t, err)
	assert.Equal(t, m, again)
}

func TestAManifestWithoutTheOptionalKeysIsUnchanged(t *testing.T) {
	m, err := Decode(strings.NewReader(valid()))
	require.NoError(t, err)
	assert.Equal(t, []string{"http://127.0.0.1:8080/wsl.msi"}, m.Artifacts[1].URLs())
	assert.Equal(t, DefaultInstall, m.Artifacts[1].InstallPlan(), "no plan: the MSI's own dialog and a restart")
	assert.True(t, m.Artifacts[1].InstallPlan().Restart)
	var buf bytes.Buffer
	require.NoError(t, Encode(m, &buf))
	assert.NotContains(t, buf.String(), "mirrors", "an old manifest encodes as it was")
	assert.NotContains(t, buf.String(), `"install"`)
	m.Artifacts[1].Install = &Install{Restart: false}
	buf.Reset()
	require.NoError(t, Encode(m, &buf))
	assert.Contains(t, buf.String(), `"args": []`, "no args encode as an empty array, which decodes")
	_, err = Decode(&buf)
	require.NoError(t, err)
}

func TestMirrorsAndInstallRefusals(t *testing.T) {
	v := withMirrorsAndInstall()
	many := `"mirrors":[` + strings.Repeat(`"https://m.example/x",`, MaxMirrors) + `"https://m.example/y"],`
	for name, c := range map[string]struct{ doc, want string }{
		"empty mirrors":       {strings.Replace(v, `"mirrors":["https://mirror-a.example.net/oac/rootfs.tar.gz","http://[::1]:8081/rootfs.tar.gz"]`, `"mirrors":[]`, 1), "artifact \"rootfs-windows-amd64\": mirrors must list 1 to 7 URLs"},
		"too many mirrors":    {strings.Replace(valid(), `"size":3,`, many+`"size":3,`, 1), "artifact 0: more than 7 mirrors"},
		"mirrors not array":   {strings.Replace(valid(), `"size":3,`, `"mirrors":"https://m.example/x","size":3,`, 1), "artifact 0: mirrors must be an array"},
		"mirror not a string": {strings.Replace(valid(), `"size":3,`, `"mirrors":[1],`+`"size":3,`, 1), "wrong type"},
		"mirror with query":   {strings.Replace(v, "https://mirror-a.example.net/oac/rootfs.tar.gz", "https://mirror-a.example.net/oac/rootfs.tar.gz?token=hunter2", 1), "mirror 0: url must have no user info, query"},
		"mirror user info":    {strings.Replace(v, "https://mirror-a.example.net/", "https://u:hunter2@mirror-a.example.net/", 1), "mirror 0: url must have no user info"},
		"mirror plain http":   {strings.Replace(v, "https://mirror-a.example.net/", "http://mirror-a.example.net/", 1), "mirror 0: url must be https"},
		"mirror is the url":   {strings.Replace(v, "https://mirror-a.example.net/oac/rootfs.tar.gz", "https://images.example.com/oac/rootfs.tar.gz", 1), "mirror 0: the same URL is listed twice"},
		"mirror twice":        {strings.Replace(v, "http://[::1]:8081/rootfs.tar.gz", "https://mirror-a.example.net/oac/rootfs.tar.gz", 1), "mirror 1: the same URL is listed twice"},
		"mirror case variant": {strings.Replace(v, `"mirrors"`, `"Mirrors"`, 1), `artifact 0: unknown key "Mirrors"`},
		"mirrors twice":       {strings.Replace(v, `"mirrors":[`, `"mirrors":["https://x.example/a"],"mirrors":[`, 1), `artifact 0: duplicate key "mirrors"`},
		"install elsewhere":   {strings.Replace(valid(), `"url":"https://images.example.com/oac/rootfs.tar.gz",`, `"url":"https://images.example.com/oac/rootfs.tar.gz","install":{"args":[],"restart":false},`, 1), "install is only for kind wsl-installer"},
		"install unknown key": {strings.Replace(v, `"restart":true`, `"restart":true,"program":"cmd.exe"`, 1), `artifact 1: install: unknown key "program"`},
		"install no restart":  {strings.Replace(v, `,"restart":true`, ``, 1), `artifact 1: install: missing key "restart"`},
		"install not object":  {strings.Replace(v, `"install":{"args":["/passive","/norestart"],"restart":true}`, `"install":["/passive"]`, 1), "artifact 1: install must be an object"},
		"args null":           {strings.Replace(v, `"args":["/passive","/norestart"]`, `"args":null`, 1), "artifact 1: install: args must be an array"},
		"arg with a space":    {strings.Replace(v, `"/passive"`, `"/passive & calc"`, 1), "install: arg 0 must be 1 to 128 of"},
		"arg with a quote":    {strings.Replace(v, `"/norestart"`, `"/norestart\""`, 1), "install: arg 1 must be"},
		"empty arg":           {strings.Replace(v, `"/passive"`, `""`, 1), "install: arg 0 must be"},
		"long arg":            {strings.Replace(v, `"/passive"`, `"/`+strings.Repeat("p", MaxInstallArgLen)+`"`, 1), "install: arg 0 must be"},
		"too many args":       {strings.Replace(v, `"args":["/passive","/norestart"]`, `"args":[`+strings.Repeat(`"/a",`, MaxInstallArgs)+`"/b"]`, 1), "artifact 1: install: more than 16 args"},
		"restart as string":   {strings.Replace(v, `"restart":true`, `"restart":"yes"`, 1), "wrong type"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(strings.NewReader(c.doc))
			require.Error(t, err)
			assert.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, err.Error(), c.want)
			assert.NotContains(t, err.Error(), "hunter2", "errors never echo a URL")
			assert.NotContains(t, err.Error(), "example", "errors never echo a URL")
		})
	}
}
