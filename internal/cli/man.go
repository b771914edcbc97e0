package cli

// The man pages are written here rather than by cobra/doc, which pulls a
// markdown renderer and a YAML library into the binary. Measured (issue
// 21, as in daemon/metrics/promtext.go): `enforcerd --help` starts in
// 4.68 ms with cobra/doc linked, 4.71 ms without (best of 10 rounds of
// 150), and its package init adds 0.07 ms (1.24 -> 1.31 ms, median of 15):
// no start-up reason remains, only 0.5 MB of binary. This writer stays for
// now because replacing it changes the installed pages' text, which the
// rooms issue (no behaviour change) does not; cobra/doc is the candidate.

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// writeManPages writes one section-1 man page per visible command into dir
// (enforcerd.1, enforcerd-session-create.1, ...), from the same definitions
// as --help. date is the pages' date (the clock seam, for reproducible
// pages).
func writeManPages(root *cobra.Command, dir string, date time.Time, version string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("man pages: %w", err)
	}
	for _, cmd := range AllCommands(root) {
		if !cmd.IsAvailableCommand() {
			continue
		}
		path := filepath.Join(dir, manName(cmd)+".1")
		if err := os.WriteFile(path, manPage(cmd, date, version), 0o644); err != nil {
			return fmt.Errorf("man pages in %s: %w", dir, err)
		}
	}
	return nil
}

// manName is a command's page name: its path with dashes.
func manName(cmd *cobra.Command) string {
	return strings.ReplaceAll(cmd.CommandPath(), " ", "-")
}

// manPage renders one command's page in roff (man macros): name, synopsis,
// description, its options, the inherited ones, examples, see also.
func manPage(cmd *cobra.Command, date time.Time, version string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, ".TH %q \"1\" %q %q \"enforcerd manual\"\n", strings.ToUpper(manName(cmd)), date.Format("Jan 2006"), "enforcerd "+version)
	fmt.Fprintf(&b, ".SH NAME\n%s \\- %s\n", manName(cmd), roffText(cmd.Short))
	fmt.Fprintf(&b, ".SH SYNOPSIS\n\\fB%s\\fP\n", roffText(cmd.UseLine()))
	desc := cmd.Long
	if desc == "" {
		desc = cmd.Short
	}
	fmt.Fprintf(&b, ".SH DESCRIPTION\n%s\n", roffParagraphs(desc))
	writeManFlags(&b, "OPTIONS", cmd.NonInheritedFlags())
	writeManFlags(&b, "OPTIONS INHERITED FROM PARENT COMMANDS", cmd.InheritedFlags())
	if cmd.Example != "" {
		fmt.Fprintf(&b, ".SH EXAMPLE\n.nf\n%s\n.fi\n", roffText(cmd.Example))
	}
	var see []string
	if cmd.HasParent() {
		see = append(see, fmt.Sprintf("\\fB%s(1)\\fP", manName(cmd.Parent())))
	}
	for _, sub := range cmd.Commands() {
		if sub.IsAvailableCommand() {
			see = append(see, fmt.Sprintf("\\fB%s(1)\\fP", manName(sub)))
		}
	}
	if len(see) > 0 {
		fmt.Fprintf(&b, ".SH SEE ALSO\n%s\n", strings.Join(see, ", "))
	}
	return b.Bytes()
}

// writeManFlags lists a flag set under heading, one tagged paragraph each.
func writeManFlags(b *bytes.Buffer, heading string, flags *pflag.FlagSet) {
	if !flags.HasAvailableFlags() {
		return
	}
	fmt.Fprintf(b, ".SH %s\n", heading)
	flags.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		tag := "\\fB--" + roffText(f.Name) + "\\fP"
		if f.Shorthand != "" && f.ShorthandDeprecated == "" {
			tag = "\\fB-" + f.Shorthand + "\\fP, " + tag
		}
		if varname, _ := pflag.UnquoteUsage(f); varname != "" {
			tag += "=" + roffText(varname)
		}
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "[]" {
			tag += fmt.Sprintf(" (default %s)", roffText(f.DefValue))
		}
		_, usage := pflag.UnquoteUsage(f)
		fmt.Fprintf(b, ".TP\n%s\n%s\n", tag, roffText(usage))
	})
}

// roffText escapes text for roff: backslashes, and a line that would start
// with a control character ('.' or ').
func roffText(s string) string {
	s = strings.ReplaceAll(s, `\`, `\e`)
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, ".") || strings.HasPrefix(l, "'") {
			lines[i] = `\&` + l
		}
	}
	return strings.Join(lines, "\n")
}

// roffParagraphs renders text whose paragraphs are separated by blank lines;
// indented lines (examples, lists) are kept as they are, unfilled.
func roffParagraphs(s string) string {
	var out []string
	for _, para := range strings.Split(strings.TrimSpace(s), "\n\n") {
		if strings.HasPrefix(para, " ") || strings.Contains(para, "\n ") {
			out = append(out, ".PP\n.nf\n"+roffText(para)+"\n.fi")
			continue
		}
		out = append(out, ".PP\n"+roffText(para))
	}
	return strings.Join(out, "\n")
}
