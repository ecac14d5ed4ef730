package osthread

import (
	"os"
	"runtime"
	"testing"
)

// The main goroutine starts on the main thread; holding it there lets a
// test run code on the main thread on purpose.
func init() { runtime.LockOSThread() }

var onMainThread = make(chan func())

// TestMain runs the tests beside the main goroutine, which serves
// runOnMainThread.
func TestMain(m *testing.M) {
	done := make(chan int)
	go func() { done <- m.Run() }()
	for {
		select {
		case f := <-onMainThread:
			f()
		case code := <-done:
			os.Exit(code)
		}
	}
}

func runOnMainThread(f func()) {
	done := make(chan struct{})
	onMainThread <- func() { defer close(done); f() }
	<-done
}
