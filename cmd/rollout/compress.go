package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/rollout-rl/rollout/internal/util/secrets"
	"github.com/rollout-rl/rollout/trajectory/compress"
)

func init() { register(newCompressCmd) }

func newCompressCmd() *cobra.Command {
	var (
		out, tokURL, tokBackend, model, sumURL, sumModel, keyEnv, metrics string
		noNotice                                                          bool
		opts                                                              compress.Options
	)
	cmd := &cobra.Command{
		Use:   "compress IN.jsonl -o OUT.jsonl --tokenizer URL --summarizer URL --summarizer-model M",
		Short: "Shrink ShareGPT SFT conversations to a token budget, summarizing their middle turns",
		Long: `Read ShareGPT JSONL (what "rollout export sft" writes, or Hermes' batch runner) and write it
again with every conversation over --target-tokens compressed, as Hermes' trajectory compressor does:
its opening turns (the first system, human, gpt and tool turns) and its last --protect-last turns stay,
and the turns after the opening are replaced, from the first on, by one human turn
"[CONTEXT SUMMARY]: …" that an LLM writes in about --summary-tokens tokens, until the conversation fits.
Tokens are counted by the target model's tokenizer on an inference server (--tokenizer). Other fields
of each line are kept. A conversation whose summary fails stays as it was and is counted; see
docs/trajectory-schema.md ("Compressing SFT data").`,
		Example: `  rollout export sft out/run -o sft.jsonl
  rollout compress sft.jsonl -o sft-16k.jsonl --tokenizer http://127.0.0.1:8000 --model Qwen/Qwen3-8B \
      --summarizer http://127.0.0.1:8001 --summarizer-model Qwen/Qwen3-32B --metrics compression.json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" || tokURL == "" || sumURL == "" || sumModel == "" {
				return usageError(cmd, errors.New("-o, --tokenizer, --summarizer and --summarizer-model are required"))
			}
			if noNotice {
				opts.Notice = "-"
			}
			key := ""
			if keyEnv != "" {
				var err error
				if key, err = secrets.Lookup(keyEnv); err != nil {
					return usageError(cmd, fmt.Errorf("--api-key-env: %w", err))
				}
			}
			log := newLogger(os.Stderr)
			tok, err := compress.NewEngineTokenizer(tokURL, tokBackend, model, key, log)
			if err != nil {
				return usageError(cmd, err)
			}
			defer tok.Close()
			sum, err := compress.NewChatSummarizer(sumURL, sumModel, key, log)
			if err != nil {
				return usageError(cmd, err)
			}
			defer sum.Close()
			var in io.Reader = os.Stdin
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return withExitCode(1, err)
				}
				defer f.Close()
				in = f
			}
			var st compress.Stats
			err = writeOutput(out, func(w io.Writer) error {
				var err error
				st, err = compress.Run(cmd.Context(), in, w, tok, sum, opts)
				return err
			})
			if err != nil {
				return withExitCode(1, err)
			}
			if metrics != "" {
				b, _ := json.MarshalIndent(st, "", "  ")
				if err := os.WriteFile(metrics, append(b, '\n'), 0o644); err != nil {
					return withExitCode(1, fmt.Errorf("write metrics: %w", err))
				}
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%d conversations: %d within the target, %d compressed (%d still over), %d with nothing to summarize, %d failed; tokens %d -> %d\n",
				st.Lines, st.WithinLimit, st.Compressed, st.StillOver, st.Uncompressible, st.Failed, st.TokensBefore, st.TokensAfter)
			for _, e := range st.Errors {
				fmt.Fprintf(cmd.ErrOrStderr(), "  line %d: %s\n", e.Line, e.Error)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&out, "output", "o", "", "output JSONL file (- for stdout); written whole or not at all")
	fl.StringVar(&tokURL, "tokenizer", "", "inference server whose tokenizer counts the tokens (the target model's)")
	fl.StringVar(&tokBackend, "tokenizer-backend", "vllm", "its /tokenize flavour: vllm, sglang or llamacpp")
	fl.StringVar(&model, "model", "", "model name sent to the tokenizer (vllm, sglang)")
	fl.StringVar(&sumURL, "summarizer", "", "OpenAI-compatible server that writes the summaries")
	fl.StringVar(&sumModel, "summarizer-model", "", "model of the summarizer")
	fl.StringVar(&keyEnv, "api-key-env", "", "environment variable holding the servers' API key")
	fl.IntVar(&opts.TargetTokens, "target-tokens", 15250, "token budget of a whole conversation")
	fl.IntVar(&opts.SummaryTokens, "summary-tokens", 750, "size the summary is written to")
	fl.IntVar(&opts.ProtectLast, "protect-last", 4, "last turns that stay as they are (-1: none)")
	fl.BoolVar(&noNotice, "no-notice", false, "do not tell the model in the system turn that some turns were summarized")
	fl.IntVar(&opts.Concurrency, "concurrency", 8, "conversations worked on at once")
	fl.StringVar(&metrics, "metrics", "", "write the counts as JSON to this file")
	return cmd
}
