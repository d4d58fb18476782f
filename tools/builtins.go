package tools

// Builtins returns fresh descriptions of the built-in tools:
// terminal, process (toolset terminal); read_file, write_file, patch,
// search_files (toolset file); todo (toolset todo).
func Builtins() []Tool {
	return []Tool{terminalTool(), processTool(), readFileTool(), writeFileTool(), patchTool(), searchTool(), todoTool()}
}
