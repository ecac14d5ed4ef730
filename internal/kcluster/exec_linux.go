package kcluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// ExecResult is what a command run in a container printed and how it
// ended.
type ExecResult struct {
	Stdout, Stderr []byte
	// Status is the API's final status ("Success" or "Failure"), Message
	// its message (the exit code is in it on failure).
	Status, Message string
}

// Exec runs cmd in a container of a pod through the API's pods/exec
// subresource over a websocket (the v5.channel.k8s.io protocol, stdout
// and stderr only), and waits until it ends or ctx is done.
func (c *Cluster) Exec(ctx context.Context, namespace, pod, container string, cmd ...string) (*ExecResult, error) {
	var stdout, stderr bytes.Buffer
	res, err := c.ExecTo(ctx, nil, &stdout, &stderr, namespace, pod, container, cmd...)
	if res != nil {
		res.Stdout, res.Stderr = stdout.Bytes(), stderr.Bytes()
	}
	return res, err
}

// ExecTo is Exec writing the command's output to stdout and stderr as it
// arrives, and, when stdin is not nil, sending what it reads from stdin
// as the command's standard input (the benchmarks move more through
// pods/exec than memory should hold; the command must end by itself: its
// input is not closed at stdin's end). The result's Stdout and Stderr
// stay empty.
func (c *Cluster) ExecTo(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer, namespace, pod, container string, cmd ...string) (*ExecResult, error) {
	q := url.Values{"stdout": {"true"}, "stderr": {"true"}}
	if stdin != nil {
		q.Set("stdin", "true")
	}
	if container != "" {
		q.Set("container", container)
	}
	for _, a := range cmd {
		q.Add("command", a)
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return nil, err
	}
	path := "/api/v1/namespaces/" + namespace + "/pods/" + pod + "/exec?" + q.Encode()
	tr, ok := c.client.Transport.(*http.Transport)
	if !ok {
		return nil, errors.New("kcluster: no TLS configuration")
	}
	cfg := tr.TLSClientConfig.Clone()
	cfg.NextProtos = []string{"http/1.1"}
	d := tls.Dialer{Config: cfg}
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(5 * time.Minute))
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	keyb := make([]byte, 16)
	_, _ = rand.Read(keyb)
	key := base64.StdEncoding.EncodeToString(keyb)
	req := "GET " + path + " HTTP/1.1\r\n" +
		"Host: " + u.Host + "\r\n" +
		"Authorization: Bearer " + c.Token + "\r\n" +
		"Upgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Version: 13\r\n" +
		"Sec-WebSocket-Key: " + key + "\r\n" +
		"Sec-WebSocket-Protocol: v5.channel.k8s.io, v4.channel.k8s.io\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		return nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, fmt.Errorf("kcluster: exec: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, &APIError{Status: resp.StatusCode, Body: strings.TrimSpace(string(b))}
	}
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	if resp.Header.Get("Sec-WebSocket-Accept") != base64.StdEncoding.EncodeToString(sum[:]) {
		return nil, errors.New("kcluster: exec: bad Sec-WebSocket-Accept")
	}
	res := &ExecResult{}
	var wmu sync.Mutex // the stdin copier's frames and the pongs
	if stdin != nil {
		go func() {
			buf := make([]byte, 1+256<<10) // channel 0, then the data
			for {
				n, err := stdin.Read(buf[1:])
				if n > 0 {
					wmu.Lock()
					werr := writeFrame(conn, 0x2, buf[:1+n])
					wmu.Unlock()
					if werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
	var msg []byte
	for {
		fin, op, payload, err := readFrame(br)
		if err != nil {
			if errors.Is(err, io.EOF) && res.Status != "" {
				return res, nil
			}
			return res, fmt.Errorf("kcluster: exec: %w", err)
		}
		switch op {
		case 0x8: // close
			return res, nil
		case 0x9: // ping: answer with a pong
			wmu.Lock()
			_ = writeFrame(conn, 0xA, payload)
			wmu.Unlock()
			continue
		case 0xA:
			continue
		}
		msg = append(msg, payload...)
		if !fin {
			continue
		}
		if len(msg) > 0 {
			switch msg[0] {
			case 1, 2:
				w := stdout
				if msg[0] == 2 {
					w = stderr
				}
				if _, err := w.Write(msg[1:]); err != nil {
					return res, fmt.Errorf("kcluster: exec: %w", err)
				}
			case 3:
				var st struct{ Status, Message string }
				if err := json.Unmarshal(msg[1:], &st); err == nil {
					res.Status, res.Message = st.Status, st.Message
				}
			}
		}
		msg = nil
	}
}

// readFrame reads one websocket frame (a server's frames are not masked).
func readFrame(r *bufio.Reader) (fin bool, op byte, payload []byte, err error) {
	var h [2]byte
	if _, err = io.ReadFull(r, h[:]); err != nil {
		return
	}
	fin, op = h[0]&0x80 != 0, h[0]&0x0f
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err = io.ReadFull(r, b[:]); err != nil {
			return
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err = io.ReadFull(r, b[:]); err != nil {
			return
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	if n > 64<<20 {
		return false, 0, nil, errors.New("websocket frame too large")
	}
	var mask [4]byte
	if h[1]&0x80 != 0 {
		if _, err = io.ReadFull(r, mask[:]); err != nil {
			return
		}
	}
	payload = make([]byte, n)
	if _, err = io.ReadFull(r, payload); err != nil {
		return
	}
	if h[1]&0x80 != 0 {
		for i := range payload {
			payload[i] ^= mask[i%4]
		}
	}
	return
}

// writeFrame writes one final, masked frame (a client's must be).
func writeFrame(w io.Writer, op byte, payload []byte) error {
	b := make([]byte, 0, 14+len(payload))
	b = append(b, 0x80|op)
	switch n := len(payload); {
	case n < 126:
		b = append(b, 0x80|byte(n))
	case n < 1<<16:
		b = append(b, 0x80|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, 0x80|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	var mask [4]byte
	_, _ = rand.Read(mask[:])
	b = append(b, mask[:]...)
	b = append(b, payload...)
	maskBytes(b[len(b)-len(payload):], mask)
	_, err := w.Write(b)
	return err
}

// maskBytes XORs p with the repeated mask, eight bytes at a time (the
// benchmarks send hundreds of MiB through it).
func maskBytes(p []byte, mask [4]byte) {
	m32 := binary.LittleEndian.Uint32(mask[:])
	m64 := uint64(m32) | uint64(m32)<<32
	i := 0
	for ; i+8 <= len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], binary.LittleEndian.Uint64(p[i:])^m64)
	}
	for ; i < len(p); i++ {
		p[i] ^= mask[i%4]
	}
}
