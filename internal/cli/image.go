package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	units "github.com/docker/go-units"
	"github.com/spf13/cobra"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/container/rules"
)

const imageSubcommands = "import, ls or rm"

const imageLong = `Manage the daemon's image store (<state-dir>/images, by default
/var/lib/enforcerd/images): root filesystems unpacked from image archives, which
"session create NAME --image IMAGE" runs a sandbox from. Every subcommand goes
through the daemon's API socket: the daemon is the store's only writer and the
one that knows which sessions use an image.`

func (c *CLI) imageCommand(glob *GlobalOpts) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image SUBCOMMAND [ARGS]",
		Short: "import, list and remove sandbox images",
		Long:  imageLong,
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			name := c.Prog + " image"
			switch {
			case len(args) == 0:
				return UsageErr(name, "missing subcommand (%s)", imageSubcommands)
			case args[0] == "help":
				if err := cmd.Help(); err != nil {
					return err
				}
				return errHelpShown
			}
			return unknownCommand(cmd, name, "subcommand", args[0], imageSubcommands)
		},
		SuggestionsMinimumDistance: 2,
	}
	cmd.AddCommand(c.imageImport(glob), c.imageList(glob), c.imageRemove(glob))
	return cmd
}

const imageImportLong = `Import an image as NAME (1 to 63 of a-z, 0-9, '.', '_' and '-', starting with
a letter or digit) from FILE: an archive "docker save" or "podman save" wrote,
an OCI image layout directory ("skopeo copy ... oci:DIR"), or a tar of one
("oci-archive:"); "-" reads an archive from standard input. Nothing is fetched
from a registry.

The daemon unpacks the image's layers in order into a new directory of its
store, with whiteouts applied, and renames it into place once every layer is
applied. An entry that would leave the image (a ".." or absolute path, a
directory that is a symlink leading out of the image, a hard link to a file
that is not in the image) is refused with one line naming it, and nothing is
kept. Owners, modes (setuid and setgid bits included) and symlinks are kept as
in the image; device nodes are skipped and counted (a sandbox's /dev comes
from the runtime and its root is mounted nodev).`

func (c *CLI) imageImport(glob *GlobalOpts) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "import NAME FILE",
		Short: "import a docker save archive or an OCI image layout",
		Long:  imageImportLong,
		Args:  cobra.ArbitraryArgs,
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the image as JSON")
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		name := c.Prog + " image import"
		switch {
		case len(args) == 0:
			return UsageErr(name, "missing image NAME and FILE")
		case len(args) == 1:
			return UsageErr(name, "missing FILE after NAME %q (a docker save archive, an OCI layout directory or its tar, - for stdin)", args[0])
		case len(args) > 2:
			return UsageErr(name, "unexpected argument %q after FILE %q", args[2], args[1])
		}
		imageName, file := args[0], args[1]
		if err := rules.ValidateImageName(imageName); err != nil {
			return UsageErr(name, "%v", err)
		}
		body, source, err := c.openImageSource(file)
		if err != nil {
			return RefusedErr(name, err)
		}
		defer body.Close()
		ctx, cancel := signalContext()
		defer cancel()
		info, err := api.NewClient(c.SocketPath(glob)).ImportImage(ctx, imageName, source, body)
		if err != nil {
			return RefusedErr(name, err)
		}
		if asJSON {
			return WriteJSON(c.Stdout, info)
		}
		skipped := ""
		if info.SkippedDevices > 0 {
			skipped = fmt.Sprintf(", %d device nodes skipped", info.SkippedDevices)
		}
		fmt.Fprintf(c.Stdout, "imported %s: %s, %d layers, %s%s\n", info.Name, info.Digest, info.Layers,
			units.BytesSize(float64(info.SizeBytes)), skipped)
		return nil
	}
	return cmd
}

// openImageSource opens what import sends: stdin, an archive file, or an
// OCI layout directory tarred on the fly.
func (c *CLI) openImageSource(file string) (io.ReadCloser, string, error) {
	if file == "-" {
		return io.NopCloser(c.Stdin), "stdin", nil
	}
	fi, err := os.Stat(file)
	if err != nil {
		return nil, "", fmt.Errorf("FILE %q: %w", file, pathErr(err))
	}
	source := filepath.Base(file)
	if fi.IsDir() {
		if _, err := os.Stat(filepath.Join(file, "oci-layout")); err != nil {
			return nil, "", fmt.Errorf("FILE %q: a directory without an oci-layout file; want an OCI image layout or an archive", file)
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(rules.TarLayout(file, pw)) }()
		return pr, source, nil
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, "", fmt.Errorf("FILE %q: %w", file, pathErr(err))
	}
	return f, source, nil
}

// pathErr drops the path an *os.PathError repeats (the message names it).
func pathErr(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

func (c *CLI) imageList(glob *GlobalOpts) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:               "ls [--json]",
		Short:             "list images and the sessions using each",
		Long:              "List the daemon's images, each with the sessions whose sandbox runs from it.",
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		name := c.Prog + " image ls"
		if err := NoArgs(name, "", args); err != nil {
			return err
		}
		ctx, cancel := signalContext()
		defer cancel()
		list, err := api.NewClient(c.SocketPath(glob)).Images(ctx)
		if err != nil {
			return RefusedErr(name, err)
		}
		if list == nil {
			list = []api.ImageInfo{}
		}
		if asJSON {
			return WriteJSON(c.Stdout, list)
		}
		tw := tabwriter.NewWriter(c.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tDIGEST\tLAYERS\tSIZE\tUSED BY\tAGE")
		for _, im := range list {
			digest := im.Digest
			if len(digest) > 19 {
				digest = digest[:19]
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", im.Name, digest, im.Layers,
				units.BytesSize(float64(im.SizeBytes)), orDash(strings.Join(im.UsedBy, ",")), age(c.Now(), im.Imported))
		}
		return tw.Flush()
	}
	return cmd
}

func (c *CLI) imageRemove(glob *GlobalOpts) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "rm NAME",
		Short: "remove an image no session uses",
		Long:  "Remove an image from the daemon's store. Refused, naming the sessions, while a session's sandbox runs from it.",
		Args:  cobra.ArbitraryArgs,
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print the removed name as JSON: {"deleted": [NAME]}`)
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		name := c.Prog + " image rm"
		switch {
		case len(args) == 0:
			return UsageErr(name, "missing image NAME")
		case len(args) > 1:
			return UsageErr(name, "unexpected argument %q after NAME %q", args[1], args[0])
		}
		ctx, cancel := signalContext()
		defer cancel()
		if err := api.NewClient(c.SocketPath(glob)).RemoveImage(ctx, args[0]); err != nil {
			return RefusedErr(name, err)
		}
		if asJSON {
			return WriteJSON(c.Stdout, api.DeleteResponse{Deleted: []string{args[0]}})
		}
		fmt.Fprintln(c.Stdout, args[0])
		return nil
	}
	return cmd
}
