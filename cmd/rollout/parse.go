package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/parsers"
)

func init() { register(newParseCmd) }

func newParseCmd() *cobra.Command {
	var (
		parserName, reasoningName, toolsPath string
		list, listReasoning, noThinking      bool
	)
	cmd := &cobra.Command{
		Use:   "parse --parser NAME [--reasoning-parser NAME] [--tools tools.json] < output.txt",
		Short: "Parse raw model output (stdin) into content, reasoning and tool calls",
		Long: "Reads one raw model output on stdin and prints one JSON object:\n" +
			`{"content": str|null, "reasoning": str|null, "tool_calls": [{"id","type":"function","function":{"name","arguments"}}], "errors": [...]}` + "\n" +
			"Parser names are vLLM's --tool-call-parser and --reasoning-parser values.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if list || listReasoning {
				names := parsers.Names()
				if listReasoning {
					names = parsers.ReasoningNames()
				}
				_, err := fmt.Fprintln(out, strings.Join(names, "\n"))
				return err
			}
			if parserName == "" {
				return usageError(cmd, errors.New("--parser is required (see --list)"))
			}
			tp, err := parsers.Get(parserName)
			if err != nil {
				return withExitCode(2, err)
			}
			var rp parsers.ReasoningParser
			if reasoningName != "" {
				if rp, err = parsers.GetReasoning(reasoningName); err != nil {
					return withExitCode(2, err)
				}
			}
			var tools []parsers.ToolSchema
			if toolsPath != "" {
				data, err := os.ReadFile(toolsPath)
				if err != nil {
					return withExitCode(2, fmt.Errorf("read tools: %w", err))
				}
				if tools, err = parsers.ToolsFromOpenAI(data); err != nil {
					return withExitCode(2, fmt.Errorf("%s: %w", toolsPath, err))
				}
			}
			text, err := io.ReadAll(cmd.InOrStdin())
			if err != nil {
				return fmt.Errorf("read model output from stdin: %w", err)
			}
			res := parsers.Split(string(text), tp, rp, tools, parsers.ReasoningOptions{ThinkingDisabled: noThinking})
			js, err := res.MarshalJSON()
			if err != nil {
				return fmt.Errorf("encode result: %w", err)
			}
			_, err = fmt.Fprintf(out, "%s\n", js)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&parserName, "parser", "", "tool-call parser (vLLM --tool-call-parser name)")
	f.StringVar(&reasoningName, "reasoning-parser", "", "reasoning parser run before tool parsing (vLLM --reasoning-parser name)")
	f.StringVar(&toolsPath, "tools", "", "OpenAI-style tools array (JSON file) used to type arguments")
	f.BoolVar(&list, "list", false, "print the tool-call parser names, one per line")
	f.BoolVar(&listReasoning, "list-reasoning", false, "print the reasoning parser names, one per line")
	f.BoolVar(&noThinking, "thinking-disabled", false, "the request set enable_thinking=false (qwen3, deepseek_v3, glm45, kimi_k2)")
	return cmd
}
