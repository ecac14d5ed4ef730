package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/oac/sandbox-agent/bench/internal/probe"
)

func main() {
	cl, err := probe.Dial(os.Args[1])
	if err != nil {
		panic(err)
	}
	n, _ := strconv.Atoi(os.Args[3])
	for _, proxy := range []string{"", "127.0.0.1:3128"} {
		for i := 0; i < 3; i++ {
			v, err := cl.Run(probe.Request{Cmd: os.Args[2], Target: os.Args[4], Proxy: proxy, N: n})
			fmt.Println(os.Args[2], "proxy=", proxy, v, err)
		}
	}
}
