// Command enforcerd is the daemon and its command-line client.
package main

import (
	"fmt"
	"os"
)

var version = "0.1.0-dev"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println("enforcerd", version)
		return
	}
	fmt.Fprintln(os.Stderr, "usage: enforcerd version")
	os.Exit(2)
}
