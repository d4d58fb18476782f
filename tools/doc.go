// Package tools owns the tool registry, the built-in tools (terminal, process, file tools, todo), toolsets and distributions, argument validation and result budgets. Tools reach the outside world only through a sandbox.
package tools
