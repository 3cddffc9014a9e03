package client

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"millm.ai/client/millmv1"
)

// Tool calling without an engine: the request the helpers build, and fragments folded.
func TestToolRequestAndFolding(t *testing.T) {
	weather := map[string]any{"type": "object",
		"properties": map[string]any{"city": map[string]any{"type": "string"}}}
	tool, err := Tool("get_weather", "Weather now", weather)
	if err != nil {
		t.Fatal(err)
	}
	untyped, _ := Tool("get_time", "", nil)
	request := &millmv1.GenerateRequest{
		Model: "millm-tiny",
		Input: &millmv1.GenerateRequest_Chat{Chat: &millmv1.ChatInput{Messages: []*millmv1.ChatMessage{
			{Role: millmv1.Role_ROLE_USER, Content: "Weather in Oslo?"},
			AssistantMessage("", []ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Oslo"}`}}),
			ToolMessage("call_1", "12 C"),
		}}},
		Tools:             []*millmv1.FunctionTool{tool, untyped},
		ToolChoice:        ToolChoice("get_weather"),
		ParallelToolCalls: proto.Bool(false),
	}
	wire, err := proto.Marshal(request)
	if err != nil {
		t.Fatal(err)
	}
	sent := &millmv1.GenerateRequest{}
	if err := proto.Unmarshal(wire, sent); err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal([]byte(sent.GetTools()[0].GetParametersJson()), &schema); err != nil ||
		!reflect.DeepEqual(schema, weather) || sent.GetTools()[1].GetParametersJson() != "" {
		t.Fatalf("parameters: %v %v", sent.GetTools(), err)
	}
	if c := sent.GetToolChoice(); c.GetMode() != millmv1.ToolChoiceMode_TOOL_CHOICE_MODE_FUNCTION ||
		c.GetFunctionName() != "get_weather" || sent.ParallelToolCalls == nil || sent.GetParallelToolCalls() {
		t.Fatalf("tool_choice or parallel_tool_calls: %v", sent)
	}
	if ToolChoice("required").GetMode() != millmv1.ToolChoiceMode_TOOL_CHOICE_MODE_REQUIRED {
		t.Fatal("required")
	}
	messages := sent.GetChat().GetMessages()
	if call := messages[1].GetToolCalls()[0]; call.GetId() != "call_1" || call.GetArgumentsJson() != `{"city":"Oslo"}` ||
		messages[2].GetToolCallId() != "call_1" || messages[2].GetRole() != millmv1.Role_ROLE_TOOL {
		t.Fatalf("messages: %v", messages)
	}

	frag := func(i int64, id, name, args string) *millmv1.ToolCallDelta {
		return &millmv1.ToolCallDelta{Index: i, Id: id, Name: name, Arguments: args}
	}
	g := &Generation{}
	for _, r := range []*millmv1.GenerateResponse{
		{Metadata: &millmv1.ResponseMetadata{Id: "gen-1"}, Choices: []*millmv1.ChoiceDelta{{Index: 0, Text: "Checking."}}},
		{Choices: []*millmv1.ChoiceDelta{{Index: 0, ToolCalls: []*millmv1.ToolCallDelta{
			frag(0, "call_a", "get_weather", ""), frag(0, "", "", `{"city":`), frag(1, "call_b", "get_time", "{")}}}},
		{Choices: []*millmv1.ChoiceDelta{{Index: 0, ToolCalls: []*millmv1.ToolCallDelta{
			frag(0, "", "", `"Oslo"}`), frag(1, "", "", "}")},
			FinishReason: millmv1.FinishReason_FINISH_REASON_TOOL_CALLS}}},
	} {
		if err := g.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	want := []ToolCall{{"call_a", "get_weather", `{"city":"Oslo"}`}, {"call_b", "get_time", "{}"}}
	if !reflect.DeepEqual(g.ToolCalls[0], want) || g.FinishReasons[0] != "tool_calls" ||
		g.Texts[0] != "Checking." || g.ID != "gen-1" {
		t.Fatalf("folded: %+v", g)
	}
	if _, err := FoldToolCalls(want, []*millmv1.ToolCallDelta{frag(3, "c", "f", "")}); err == nil ||
		!strings.Contains(err.Error(), "index 3") {
		t.Fatalf("a skipped index: %v", err)
	}
}
