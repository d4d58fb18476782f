package sim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// hfTemplates are Jinja chat templates that render exactly what the
// simulator's Go templates render, by family. Tool schemas and call
// arguments are printed with sorted keys (the simulator's pyJSON) by the
// sortedjson macro; numbers print as the engine's tojson does, which equals
// pyJSON for numbers already written the way Python writes them.
var hfTemplates = map[string]string{
	"hermes": hermesJinja,
}

// hermesJinja mirrors renderChatML for the "hermes" template: an optional
// system turn that carries the tools, developer read as system, <think>
// prefixes dropped from assistant content, calls as <tool_call> JSON blocks
// and consecutive tool results grouped in one user turn.
const hermesJinja = `{#- rollout simulator: hermes (inference/sim/template.go renderChatML) -#}
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is iterable and content is not mapping -%}
{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}
{%- elif content is not none -%}{{ content }}
{%- endif -%}
{%- endmacro -%}
{%- macro sortedjson(v) -%}
{%- if v is mapping -%}
{{- '{' -}}
{%- for k, x in v | dictsort(case_sensitive=true) -%}
{%- if not loop.first -%}{{- ', ' -}}{%- endif -%}
{{- k | tojson -}}{{- ': ' -}}{{- sortedjson(x) -}}
{%- endfor -%}
{{- '}' -}}
{%- elif v is string -%}{{- v | tojson -}}
{%- elif v is iterable -%}
{{- '[' -}}
{%- for x in v -%}{%- if not loop.first -%}{{- ', ' -}}{%- endif -%}{{- sortedjson(x) -}}{%- endfor -%}
{{- ']' -}}
{%- else -%}{{- v | tojson -}}
{%- endif -%}
{%- endmacro -%}
{%- macro rolename(m) -%}{%- if m.role == 'developer' -%}system{%- else -%}{{ m.role }}{%- endif -%}{%- endmacro -%}
{%- set ns = namespace(first=0, system='') -%}
{%- if messages and rolename(messages[0]) == 'system' -%}
{%- set ns.first = 1 -%}
{%- set ns.system = text(messages[0].content) -%}
{%- endif -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if ns.system -%}{{- ns.system + '\n\n' -}}{%- endif -%}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools -%}
{%- set fn = tool.function -%}
{{- '\n{"function": {' -}}
{%- if fn.description -%}{{- '"description": ' + (fn.description | tojson) + ', ' -}}{%- endif -%}
{{- '"name": ' + (fn.name | tojson) -}}
{%- if fn.parameters is defined -%}{{- ', "parameters": ' + sortedjson(fn.parameters) -}}{%- endif -%}
{{- '}, "type": "function"}' -}}
{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, use this format:\n<tool_call>\n{"name": "<function-name>", "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif ns.first == 1 -%}
{{- '<|im_start|>system\n' + ns.system + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if loop.index0 >= ns.first -%}
{%- set role = rolename(message) -%}
{%- if role == 'system' or role == 'user' -%}
{{- '<|im_start|>' + role + '\n' + text(message.content) + '<|im_end|>\n' -}}
{%- elif role == 'assistant' -%}
{%- set content = text(message.content) -%}
{%- if '</think>' in content -%}
{%- set content = content[content.find('</think>') + 8:].lstrip('\n') -%}
{%- endif -%}
{{- '<|im_start|>assistant\n' + content -}}
{%- if message.tool_calls is defined and message.tool_calls -%}
{%- if content -%}{{- '\n' -}}{%- endif -%}
{%- for call in message.tool_calls -%}
{%- if not loop.first -%}{{- '\n' -}}{%- endif -%}
{%- set args = call.function.arguments -%}
{{- '<tool_call>\n{"name": ' + (call.function.name | tojson) + ', "arguments": ' -}}
{%- if args is mapping -%}{{- sortedjson(args) -}}
{%- elif args is string and args -%}{{- args -}}
{%- elif args is string -%}{{- '{}' -}}
{%- else -%}{{- sortedjson(args) -}}
{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- elif role == 'tool' -%}
{%- if loop.index0 == ns.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + text(message.content) + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
`

// HFTemplate returns the Jinja chat template that renders what the
// simulator renders for family, or an error for a family without one.
func HFTemplate(family string) (string, error) {
	src, ok := hfTemplates[family]
	if !ok {
		return "", fmt.Errorf("sim: no Jinja chat template for family %q (have: hermes)", family)
	}
	return src, nil
}

// WriteHFModel writes into dir what a vLLM user's Hugging Face model
// directory holds for the simulator's model of family: tokenizer.json (the
// byte-level vocabulary and the marker tokens of the simulator's Tokenizer)
// and tokenizer_config.json (the chat template and special tokens), so an
// in-process renderer can load the simulator's model like a real one.
func WriteHFModel(dir, family string) error {
	src, err := HFTemplate(family)
	if err != nil {
		return err
	}
	tmpl, ok := templates[defaultTemplate[family]]
	if !ok {
		return fmt.Errorf("sim: family %q has no template", family)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("sim: hf model: %w", err)
	}
	if err := writeJSONFile(filepath.Join(dir, "tokenizer.json"), hfTokenizer()); err != nil {
		return err
	}
	return writeJSONFile(filepath.Join(dir, "tokenizer_config.json"), hfTokenizerConfig(src, tmpl))
}

func writeJSONFile(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("sim: hf model: %s: %w", filepath.Base(path), err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("sim: hf model: %w", err)
	}
	return nil
}

// hfAddedToken is one entry of tokenizer.json's added_tokens.
type hfAddedToken struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// hfTokenizer is tokenizer.json: a byte-level BPE without merges, so every
// byte is one token (ids 0..255 as the simulator's), plus the markers.
func hfTokenizer() map[string]any {
	byteSyms := byteLevelAlphabet()
	vocab := make(orderedVocab, 256)
	for b := range 256 {
		vocab[b] = byteSyms[b]
	}
	added := make([]hfAddedToken, len(vocabSpecials))
	for i, sp := range vocabSpecials {
		added[i] = hfAddedToken{ID: 256 + i, Content: sp.text, Special: sp.control}
	}
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
	return map[string]any{
		"version":        "1.0",
		"truncation":     nil,
		"padding":        nil,
		"added_tokens":   added,
		"normalizer":     nil,
		"pre_tokenizer":  byteLevel,
		"post_processor": nil,
		"decoder":        byteLevel,
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": vocab, "merges": []string{},
		},
	}
}

// orderedVocab marshals as a JSON object whose keys are the byte symbols in
// id order (encoding/json would sort a map's keys).
type orderedVocab []string

// MarshalJSON writes {"symbol": id, ...} in id order.
func (v orderedVocab) MarshalJSON() ([]byte, error) {
	out := []byte{'{'}
	for id, sym := range v {
		if id > 0 {
			out = append(out, ',')
		}
		k, err := json.Marshal(sym)
		if err != nil {
			return nil, err
		}
		out = append(out, k...)
		out = append(out, ':')
		out = fmt.Appendf(out, "%d", id)
	}
	return append(out, '}'), nil
}

// byteLevelAlphabet is GPT-2's bytes-to-unicode table: printable Latin-1
// bytes stand for themselves, the others for U+0100 onwards in byte order.
func byteLevelAlphabet() [256]string {
	var out [256]string
	next := 0
	for b := range 256 {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			out[b] = string(rune(b))
			continue
		}
		out[b] = string(rune(256 + next))
		next++
	}
	return out
}

// hfTokenizerConfig is tokenizer_config.json for tmpl.
func hfTokenizerConfig(chatTemplate string, tmpl *template) map[string]any {
	cfg := map[string]any{
		"tokenizer_class":              "PreTrainedTokenizerFast",
		"chat_template":                chatTemplate,
		"eos_token":                    tmpl.eot,
		"add_bos_token":                tmpl.bos != "",
		"add_eos_token":                false,
		"model_max_length":             32768,
		"clean_up_tokenization_spaces": false,
	}
	if tmpl.bos != "" {
		cfg["bos_token"] = tmpl.bos
	} else {
		cfg["bos_token"] = nil
	}
	return cfg
}
