package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// writeManPages writes one section-1 man page per visible command into dir
// (enforcerd.1, enforcerd-session-create.1, ...), from the same definitions
// as --help. date is the pages' date (the clock seam, for reproducible
// pages).
func writeManPages(root *cobra.Command, dir string, date time.Time) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("man pages: %w", err)
	}
	header := &doc.GenManHeader{
		Section: "1",
		Date:    &date,
		Source:  "enforcerd " + version,
		Manual:  "enforcerd manual",
	}
	for _, cmd := range allCommands(root) {
		cmd.DisableAutoGenTag = true
	}
	if err := doc.GenManTree(root, header, dir); err != nil {
		return fmt.Errorf("man pages in %s: %w", dir, err)
	}
	return nil
}
