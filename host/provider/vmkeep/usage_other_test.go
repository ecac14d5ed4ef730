//go:build !unix

package vmkeep

import "os"

func diskUsage(st os.FileInfo) int64 { return st.Size() }
