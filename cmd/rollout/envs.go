package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/envs"
)

func init() { register(newEnvsCmd) }

func newEnvsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "envs [NAME]",
		Short: "List the built-in environments, or describe one (defaults, splits, env_config with its defaults)",
		Example: `  rollout envs
  rollout envs swe-tests`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			w := cmd.OutOrStdout()
			if len(args) == 0 {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tG\tMAX TURNS\tTOOLSETS\tSPLITS\tDESCRIPTION")
				for _, name := range envs.Names() {
					env, err := envs.New(name, nil)
					if err != nil {
						return fmt.Errorf("env %s: %w", name, err)
					}
					d := env.Defaults()
					desc := d.Description
					if d.EvalOnly {
						desc += " [eval-only]"
					}
					fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\n", name, d.GroupSize, d.MaxTurns,
						orDash(strings.Join(d.Toolsets, ",")), orDash(strings.Join(d.Splits, ",")), desc)
				}
				return tw.Flush()
			}
			env, err := envs.New(args[0], nil)
			if err != nil {
				return usageError(cmd, err)
			}
			d := env.Defaults()
			_, defaults, err := envs.DescribeConfig(env)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "%s: %s\n", env.Name(), d.Description)
			fmt.Fprintf(w, "group_size: %d\nmax_turns: %d\ntoolsets: %s\nsplits: %s\neval_only: %v\n",
				d.GroupSize, d.MaxTurns, orDash(strings.Join(d.Toolsets, ", ")), orDash(strings.Join(d.Splits, ", ")), d.EvalOnly)
			if defaults != "" {
				fmt.Fprintf(w, "env_config (defaults):\n%s", indent(defaults, "  "))
			}
			return nil
		},
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}
