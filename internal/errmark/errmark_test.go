package errmark

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"
)

var errKind = errors.New("kind")

func TestWithKeepsTheMessageAndAddsTheKind(t *testing.T) {
	inner := fmt.Errorf("open x: %w", fs.ErrNotExist)
	err := With(errKind, inner)
	assert.Equal(t, "open x: file does not exist", err.Error())
	assert.ErrorIs(t, err, errKind)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	wrapped := fmt.Errorf("start: %w", err)
	assert.ErrorIs(t, wrapped, errKind)
	assert.Equal(t, "start: open x: file does not exist", wrapped.Error())
}

func TestWithNil(t *testing.T) {
	assert.NoError(t, With(errKind, nil))
}
