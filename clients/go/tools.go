package client

// Tool calling: building tools, tool_choice and tool messages for a
// GenerateRequest, and folding a stream's ToolCallDelta fragments into whole
// calls. Set GenerateRequest.ParallelToolCalls with proto.Bool.

import (
	"encoding/json"
	"fmt"
	"io"

	"millm.ai/client/millmv1"
)

// Tool is a function tool. parameters is its arguments' JSON Schema: a value
// marshalled to JSON (a map, a struct, json.RawMessage), JSON text as a
// string, or nil for any object.
func Tool(name, description string, parameters any) (*millmv1.FunctionTool, error) {
	schema := ""
	switch p := parameters.(type) {
	case nil:
	case string:
		schema = p
	default:
		raw, err := json.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("tool %s: parameters: %w", name, err)
		}
		schema = string(raw)
	}
	return &millmv1.FunctionTool{Name: name, Description: description, ParametersJson: schema}, nil
}

// ToolChoice is "none", "auto", "required", or else the name of the one function to call.
func ToolChoice(choice string) *millmv1.ToolChoice {
	switch choice {
	case "none":
		return &millmv1.ToolChoice{Mode: millmv1.ToolChoiceMode_TOOL_CHOICE_MODE_NONE}
	case "auto":
		return &millmv1.ToolChoice{Mode: millmv1.ToolChoiceMode_TOOL_CHOICE_MODE_AUTO}
	case "required":
		return &millmv1.ToolChoice{Mode: millmv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED}
	}
	return &millmv1.ToolChoice{Mode: millmv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION,
		FunctionName: choice}
}

// ToolCall is one whole call of a function tool; Arguments is a JSON object as text.
type ToolCall struct {
	ID, Name, Arguments string
}

// AssistantMessage is an assistant turn that made calls (content may be empty).
func AssistantMessage(content string, calls []ToolCall) *millmv1.ChatMessage {
	m := &millmv1.ChatMessage{Role: millmv1.Role_ROLE_ASSISTANT, Content: content}
	for _, c := range calls {
		m.ToolCalls = append(m.ToolCalls,
			&millmv1.ToolCall{Id: c.ID, Name: c.Name, ArgumentsJson: c.Arguments})
	}
	return m
}

// ToolMessage is a tool's answer to the call callID.
func ToolMessage(callID, content string) *millmv1.ChatMessage {
	return &millmv1.ChatMessage{Role: millmv1.Role_ROLE_TOOL, Content: content, ToolCallId: callID}
}

// FoldToolCalls returns one choice's calls after fragments: a fragment at the
// next index starts a call (id and name), one at a known index appends to its
// arguments. A skipped index is an error. calls is not modified.
func FoldToolCalls(calls []ToolCall, fragments []*millmv1.ToolCallDelta) ([]ToolCall, error) {
	out := append([]ToolCall(nil), calls...)
	for _, f := range fragments {
		i := f.GetIndex()
		switch {
		case i == int64(len(out)):
			out = append(out, ToolCall{ID: f.GetId(), Name: f.GetName(), Arguments: f.GetArguments()})
		case i >= 0 && i < int64(len(out)):
			if out[i].ID == "" {
				out[i].ID = f.GetId()
			}
			if out[i].Name == "" {
				out[i].Name = f.GetName()
			}
			out[i].Arguments += f.GetArguments()
		default:
			return out, fmt.Errorf("tool call fragment for index %d before index %d started", i, len(out))
		}
	}
	return out, nil
}

// FinishReasonName is "stop", "length", "tool_calls", or "" while a choice runs.
func FinishReasonName(r millmv1.FinishReason) string {
	switch r {
	case millmv1.FinishReason_FINISH_REASON_STOP:
		return "stop"
	case millmv1.FinishReason_FINISH_REASON_LENGTH:
		return "length"
	case millmv1.FinishReason_FINISH_REASON_TOOL_CALLS:
		return "tool_calls"
	}
	return ""
}

// Generation is a generation's responses folded together, per choice index.
type Generation struct {
	ID, Model                      string
	Texts                          map[int64]string
	FinishReasons                  map[int64]string
	ToolCalls                      map[int64][]ToolCall
	PromptTokens, CompletionTokens int64
}

// Add folds one response in (call it on each response of a stream).
func (g *Generation) Add(r *millmv1.GenerateResponse) error {
	if g.Texts == nil {
		g.Texts, g.FinishReasons = map[int64]string{}, map[int64]string{}
		g.ToolCalls = map[int64][]ToolCall{}
	}
	if m := r.GetMetadata(); m != nil {
		g.ID, g.Model = m.GetId(), m.GetModel()
	}
	for _, d := range r.GetChoices() {
		g.Texts[d.GetIndex()] += d.GetText()
		if len(d.GetToolCalls()) > 0 {
			calls, err := FoldToolCalls(g.ToolCalls[d.GetIndex()], d.GetToolCalls())
			if err != nil {
				return fmt.Errorf("choice %d: %w", d.GetIndex(), err)
			}
			g.ToolCalls[d.GetIndex()] = calls
		}
		if reason := FinishReasonName(d.GetFinishReason()); reason != "" {
			g.FinishReasons[d.GetIndex()] = reason
		}
	}
	if u := r.GetUsage(); u != nil {
		g.PromptTokens, g.CompletionTokens = u.GetPromptTokens(), u.GetCompletionTokens()
	}
	return nil
}

// Collect reads a Generate stream to its end.
func Collect(stream millmv1.GenerationService_GenerateClient) (*Generation, error) {
	g := &Generation{}
	for {
		r, err := stream.Recv()
		if err == io.EOF {
			return g, nil
		}
		if err != nil {
			return g, err
		}
		if err := g.Add(r); err != nil {
			return g, err
		}
	}
}
