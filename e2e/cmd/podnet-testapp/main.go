// Command podnet-testapp is the one static binary of the real-node lab's test
// images (no registry, no shell in the image): the pod sandbox's pause
// process, an HTTP server that says who answered, and the clients the tests
// run with kubectl exec.
//
//	podnet-testapp pause            sleep until TERM/INT, reaping children
//	podnet-testapp serve [:8080]    answer GET / with "<hostname> <client addr>"
//	podnet-testapp get URL          print the body of a GET (exit 1 on failure)
//	podnet-testapp resolve NAME     print NAME's addresses through /etc/resolv.conf
//	podnet-testapp load URL DUR     GET URL every 20 ms for DUR (a new connection each),
//	                                print "ok N failed M" and the failures
//	podnet-testapp mix URL RATE NAME...
//	                                until TERM: GET URL every 20 ms (a new connection
//	                                each) and look the NAMEs up in turn, RATE a second;
//	                                (RATE 0, no NAME: HTTP alone); print a line a second:
//	                                "T http OK FAILED dns OK FAILED",
//	                                T the Unix second, and a "fail ..." line per failure
//	podnet-testapp dnsload RATE DUR TYPE NAME...
//	                                RATE lookups a second over UDP and RATE over TCP to
//	                                resolv.conf's nameserver (a new socket and one 2 s try
//	                                each) for DUR (0: until TERM); a line a second
//	                                "T udp OK FAILED tcp OK FAILED", "fail ...", "late ..."
//	                                and "gap FROMMS TOMS" lines (dnsload.go)
//	podnet-testapp pairs DUR WORKERS NAME
//	                                A and AAAA from one socket in one sendmmsg, back to
//	                                back for DUR: "pairs N slow S failed F max MS"
//	podnet-testapp lookups COUNT NAME
//	                                COUNT lookups through resolv.conf's search path
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: podnet-testapp pause|serve [ADDR]|get URL|resolve NAME|load URL DUR|mix URL RATE NAME...|dnsload RATE DUR TYPE NAME...|pairs DUR WORKERS NAME|lookups COUNT NAME")
		os.Exit(2)
	}
	var err error
	switch arg := func(i int) string {
		if len(os.Args) > i {
			return os.Args[i]
		}
		return ""
	}; os.Args[1] {
	case "pause":
		pause()
	case "serve":
		err = serve(arg(2))
	case "get":
		err = get(arg(2))
	case "resolve":
		err = resolve(arg(2))
	case "load":
		err = load(arg(2), arg(3))
	case "mix":
		err = mix(arg(2), arg(3), os.Args[min(4, len(os.Args)):])
	case "dnsload":
		err = dnsload(arg(2), arg(3), arg(4), os.Args[min(5, len(os.Args)):])
	case "pairs":
		err = pairs(arg(2), arg(3), arg(4))
	case "lookups":
		err = lookups(arg(2), arg(3))
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "podnet-testapp:", err)
		os.Exit(1)
	}
}

func pause() {
	c := make(chan os.Signal, 8)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range c {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			var ws syscall.WaitStatus
			if pid, _ := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 {
				break
			}
		}
	}
}

func serve(addr string) error {
	if addr == "" {
		addr = ":8080"
	}
	host, _ := os.Hostname()
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s\n", host, r.RemoteAddr)
	})
	fmt.Println("serving on", addr)
	return http.ListenAndServe(addr, nil)
}

func get(url string) error {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	fmt.Print(string(body))
	return nil
}

func resolve(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := &net.Resolver{PreferGo: true}
	addrs, err := r.LookupHost(ctx, name)
	if err != nil {
		return err
	}
	fmt.Println(strings.Join(addrs, " "))
	return nil
}

func load(url, dur string) error {
	d, err := time.ParseDuration(dur)
	if err != nil {
		return err
	}
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	ok, failed := 0, 0
	var failures []string
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		resp, err := c.Get(url)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("%s", resp.Status)
			}
		}
		if err != nil {
			failed++
			if len(failures) < 10 {
				failures = append(failures, time.Now().Format("15:04:05.000")+" "+err.Error())
			}
			continue
		}
		ok++
	}
	fmt.Printf("ok %d failed %d\n%s\n", ok, failed, strings.Join(failures, "\n"))
	return nil
}
