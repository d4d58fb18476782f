// Package toolcontext gives reward functions a handle on a finished rollout's sandbox: terminal, file transfer, search and tool calls. A ToolContext never outlives its rollout.
package toolcontext
