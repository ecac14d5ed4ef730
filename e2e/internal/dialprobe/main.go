// Command dialprobe is a TEST FIXTURE for the kubernetes rows: run in a
// Pod (exec'd into the agent's container, or as a Pod's command) it says
// what the Pod's network reaches. It is static and needs no shell.
//
//	dialprobe interfaces          the interfaces but lo, one a line
//	dialprobe connect MS ADDR...  "ADDR ok" or "ADDR fail: ERROR" for a
//	                              TCP connection to each HOST:PORT tried
//	                              within MS milliseconds
//	dialprobe listen PORT         accepts and closes connections on PORT
//	                              until SIGTERM
package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dialprobe interfaces | connect MS ADDR... | listen PORT")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "interfaces":
		ifs, err := net.Interfaces()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for _, i := range ifs {
			if i.Flags&net.FlagLoopback == 0 {
				fmt.Println(i.Name)
			}
		}
	case "connect":
		ms, err := strconv.Atoi(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, "connect: MS:", err)
			os.Exit(2)
		}
		for _, addr := range os.Args[3:] {
			conn, err := net.DialTimeout("tcp", addr, time.Duration(ms)*time.Millisecond)
			if err != nil {
				fmt.Println(addr, "fail:", err)
				continue
			}
			conn.Close()
			fmt.Println(addr, "ok")
		}
	case "listen":
		l, err := net.Listen("tcp", ":"+os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				conn.Close()
			}
		}()
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
		<-c
	default:
		fmt.Fprintln(os.Stderr, "dialprobe: unknown command", os.Args[1])
		os.Exit(2)
	}
}
