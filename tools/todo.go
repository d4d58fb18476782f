package tools

import (
	"context"
	"fmt"
	"sync"
)

const todoSchema = `{
  "type": "object",
  "properties": {
    "todos": {"type": "array", "description": "The task list. Omit to read the current list.", "items": {
      "type": "object",
      "properties": {
        "id": {"type": "string"},
        "content": {"type": "string"},
        "status": {"type": "string", "enum": ["pending", "in_progress", "completed", "cancelled"]}
      },
      "required": ["id", "content", "status"]
    }},
    "merge": {"type": "boolean", "default": false, "description": "false: replace the list; true: update items by id and append new ones."}
  }
}`

func todoTool() Tool {
	return Tool{Name: "todo", Toolset: ToolsetTodo, Parameters: []byte(todoSchema), Class: Exclusive,
		Description: "Keep a task list for this task: create, update (merge=true) or read (no todos) items with status pending, in_progress, completed or cancelled.",
		Handler:     runTodo}
}

// TodoItem is one entry of the todo list.
type TodoItem struct {
	ID      string `json:"id"`
	Content string `json:"content"`
	Status  string `json:"status"`
}

// TodoStore is the per-rollout todo list.
type TodoStore struct {
	mu    sync.Mutex
	items []TodoItem
}

// Items returns a copy of the list.
func (s *TodoStore) Items() []TodoItem {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]TodoItem{}, s.items...)
}

func (s *TodoStore) update(items []TodoItem, merge bool) []TodoItem {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !merge {
		s.items = append([]TodoItem{}, items...)
	} else {
		for _, it := range items {
			found := false
			for i := range s.items {
				if s.items[i].ID == it.ID {
					s.items[i] = it
					found = true
					break
				}
			}
			if !found {
				s.items = append(s.items, it)
			}
		}
	}
	return append([]TodoItem{}, s.items...)
}

func runTodo(_ context.Context, rt *Runtime, a Args) (string, error) {
	if rt.Todo == nil {
		rt.Todo = &TodoStore{}
	}
	var list []TodoItem
	if raw, ok := a["todos"].([]any); ok {
		for i, x := range raw {
			m, ok := x.(map[string]any)
			if !ok {
				return ErrorResult(fmt.Sprintf("todos[%d] must be an object", i)), nil
			}
			it := TodoItem{}
			it.ID, _ = m["id"].(string)
			it.Content, _ = m["content"].(string)
			it.Status, _ = m["status"].(string)
			list = append(list, it)
		}
		list = rt.Todo.update(list, a.Bool("merge", false))
	} else {
		list = rt.Todo.Items()
	}
	summary := map[string]int{"total": len(list), "pending": 0, "in_progress": 0, "completed": 0, "cancelled": 0}
	for _, it := range list {
		summary[it.Status]++
	}
	return marshal(map[string]any{"todos": list, "summary": summary}), nil
}
