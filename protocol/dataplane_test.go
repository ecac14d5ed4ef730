package protocol

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestADirectConnectHandsNoSocketAndSaysViaDirect(t *testing.T) {
	ok := Connect{ID: 1, Host: "a.test", Port: 443, Via: ViaDirect, Direct: true}
	assert.NoError(t, ok.Validate())
	for name, c := range map[string]Connect{
		"handing too":       {ID: 1, Host: "a.test", Port: 443, Via: ViaDirect, Direct: true, Hand: true},
		"another via":       {ID: 1, Host: "a.test", Port: 443, Via: ViaTransparent, Direct: true},
		"no via":            {ID: 1, Host: "a.test", Port: 443, Direct: true},
		"with early bytes":  {ID: 1, Host: "a.test", Port: 443, Via: ViaDirect, Direct: true, Early: []byte("x")},
		"an invalid target": {ID: 1, Host: "a test", Port: 443, Via: ViaDirect, Direct: true},
	} {
		assert.ErrorIs(t, c.Validate(), ErrBadBody, name)
	}
}
