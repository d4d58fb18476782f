// Package agentloop runs one agent episode: it alternates policy generations and tool executions, tracks turns and stop reasons, and returns the result. It does no I/O of its own beyond its collaborators.
package agentloop
