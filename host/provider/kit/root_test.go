package kit

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestIdentityFilesNameTheRuntimeUser(t *testing.T) {
	assert.Contains(t, Passwd(), "runtime:x:1000:1000:runtime:/home/runtime:/bin/sh\n")
	assert.Contains(t, Group(), "runtime:x:1000:\n")
	assert.Contains(t, Hosts("demo"), "127.0.1.1\tdemo\n")
	assert.NotContains(t, Hosts(""), "127.0.1.1")
}
