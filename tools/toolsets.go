package tools

import (
	"fmt"
	"math/rand/v2"
	"sort"
)

// Toolset names of the built-ins.
const (
	ToolsetTerminal = "terminal"
	ToolsetFile     = "file"
	ToolsetTodo     = "todo"
)

// Distribution gives each toolset an independent inclusion probability in
// percent (Hermes' toolset_distributions).
type Distribution struct {
	Description string
	Toolsets    map[string]float64
}

// Distributions are Hermes' named distributions, unchanged. Toolsets this
// service does not have (web, browser, vision, image_gen, moa) are skipped
// at sampling time and reported, unless the caller registered them.
var Distributions = map[string]Distribution{
	"default":        {"All tools", map[string]float64{"web": 100, "browser": 100, "terminal": 100, "file": 100, "vision": 100, "image_gen": 100, "moa": 100}},
	"image_gen":      {"Image generation focus", map[string]float64{"web": 55, "terminal": 45, "vision": 90, "image_gen": 90, "moa": 10}},
	"research":       {"Web research", map[string]float64{"web": 90, "browser": 70, "terminal": 10, "vision": 50, "moa": 40}},
	"science":        {"Scientific work", map[string]float64{"web": 94, "browser": 50, "terminal": 94, "file": 94, "vision": 65, "image_gen": 15, "moa": 10}},
	"development":    {"Software development", map[string]float64{"web": 30, "terminal": 80, "file": 80, "vision": 10, "moa": 60}},
	"safe":           {"No terminal or files", map[string]float64{"web": 80, "browser": 70, "vision": 60, "image_gen": 60, "moa": 50}},
	"balanced":       {"Every toolset at 50%", map[string]float64{"web": 50, "browser": 50, "terminal": 50, "file": 50, "vision": 50, "image_gen": 50, "moa": 50}},
	"minimal":        {"Web only", map[string]float64{"web": 100}},
	"terminal_only":  {"Terminal and files", map[string]float64{"terminal": 100, "file": 100}},
	"terminal_web":   {"Terminal, files and web", map[string]float64{"web": 100, "terminal": 100, "file": 100}},
	"creative":       {"Creative work", map[string]float64{"web": 30, "vision": 90, "image_gen": 90}},
	"reasoning":      {"Reasoning focus", map[string]float64{"web": 30, "terminal": 20, "moa": 90}},
	"browser_use":    {"Browser use", map[string]float64{"web": 80, "browser": 100, "vision": 70}},
	"browser_only":   {"Browser only", map[string]float64{"browser": 100}},
	"browser_tasks":  {"Browser tasks", map[string]float64{"browser": 97, "terminal": 15, "vision": 12}},
	"terminal_tasks": {"Terminal tasks", map[string]float64{"web": 97, "browser": 75, "terminal": 97, "file": 97, "vision": 50, "image_gen": 10}},
	"mixed_tasks":    {"Mixed tasks", map[string]float64{"web": 35, "browser": 92, "terminal": 92, "file": 92, "vision": 15, "image_gen": 15}},
}

// DistributionNames lists the known distributions, sorted.
func DistributionNames() []string { return sortedKeys(Distributions) }

// SampleToolsets draws the toolsets of one group from a distribution: each
// toolset the registry has is included independently with its probability;
// when none was drawn, the most probable available toolset is used. The
// draw is a pure function of seed, so a group (and a resumed job) always
// gets the same tools. skipped lists toolsets of the distribution that the
// registry does not have.
func (r *Registry) SampleToolsets(dist string, seed uint64) (toolsets, skipped []string, err error) {
	d, ok := Distributions[dist]
	if !ok {
		return nil, nil, fmt.Errorf("unknown toolset distribution %q; known: %v", dist, DistributionNames())
	}
	have := map[string]bool{}
	for _, ts := range r.Toolsets() {
		have[ts] = true
	}
	rng := rand.New(rand.NewPCG(seed, 0x726f6c6c6f7574)) // "rollout"
	best, bestP := "", -1.0
	// Sorted order makes the draw independent of map iteration.
	for _, ts := range sortedKeys(d.Toolsets) {
		p := d.Toolsets[ts]
		if !have[ts] {
			skipped = append(skipped, ts)
			continue
		}
		if p > bestP {
			best, bestP = ts, p
		}
		if rng.Float64()*100 < p {
			toolsets = append(toolsets, ts)
		}
	}
	if len(toolsets) == 0 {
		if best == "" {
			return nil, skipped, fmt.Errorf("distribution %q has no toolset this registry provides (it has %v)", dist, r.Toolsets())
		}
		toolsets = []string{best}
	}
	sort.Strings(toolsets)
	return toolsets, skipped, nil
}
