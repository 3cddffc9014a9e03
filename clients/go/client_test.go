package client

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"millm.ai/client/millmv1"
)

func dial(t *testing.T) *Client {
	target := os.Getenv("MILLM_TEST_TARGET")
	if target == "" {
		target = "127.0.0.1:50051"
	}
	c, err := Dial(target, "", grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func hello() *millmv1.ChatInput {
	return &millmv1.ChatInput{Messages: []*millmv1.ChatMessage{
		{Role: millmv1.Role_ROLE_USER, Content: "Hello!"},
	}}
}

func TestUnaryListModels(t *testing.T) {
	c := dial(t)
	defer c.Close()
	ctx, cancel := context.WithTimeout(c.Context(context.Background(), "go-1"), 10*time.Second)
	defer cancel()
	reply, err := c.Models.ListModels(ctx, &millmv1.ListModelsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, m := range reply.GetModels() {
		found = found || m.GetId() == "millm-tiny"
	}
	if !found {
		t.Fatalf("millm-tiny not listed: %v", reply)
	}
}

func TestStreamedGeneration(t *testing.T) {
	c := dial(t)
	defer c.Close()
	ctx, cancel := context.WithTimeout(c.Context(context.Background(), "go-2"), 30*time.Second)
	defer cancel()
	maxTokens := int64(6)
	stream, err := c.Generation.Generate(ctx, &millmv1.GenerateRequest{
		Model:    "millm-tiny",
		Input:    &millmv1.GenerateRequest_Chat{Chat: hello()},
		Sampling: &millmv1.SamplingParams{MaxTokens: &maxTokens},
	})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	var first, last *millmv1.GenerateResponse
	for {
		r, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = r
		}
		last = r
		for _, d := range r.GetChoices() {
			text.WriteString(d.GetText())
		}
	}
	if first.GetMetadata().GetModel() != "millm-tiny" {
		t.Fatalf("first response has no metadata: %v", first)
	}
	if text.Len() == 0 || last.GetUsage().GetCompletionTokens() < 1 {
		t.Fatalf("no text or usage: %q %v", text.String(), last)
	}
}

func TestRefusalCarriesTheOpenAICode(t *testing.T) {
	c := dial(t)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	temperature := 5.0
	stream, err := c.Generation.Generate(ctx, &millmv1.GenerateRequest{
		Model:    "millm-tiny",
		Input:    &millmv1.GenerateRequest_Chat{Chat: hello()},
		Sampling: &millmv1.SamplingParams{Temperature: &temperature},
	})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("want InvalidArgument, got %v", err)
	}
	code, param := ErrorCode(err)
	if code != "invalid_parameter" || param != "temperature" {
		t.Fatalf("want invalid_parameter/temperature, got %q/%q", code, param)
	}
}

func TestTokenizeRoundTrip(t *testing.T) {
	c := dial(t)
	defer c.Close()
	ctx, cancel := context.WithTimeout(c.Context(context.Background(), "go-3"), 30*time.Second)
	defer cancel()
	reply, err := c.Tokenization.Tokenize(ctx, &millmv1.TokenizeRequest{
		Model: "millm-tiny", Input: &millmv1.TokenizeRequest_Chat{Chat: hello()},
		ReturnTokenStrs: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if reply.GetCount() != int64(len(reply.GetTokens())) || reply.GetTokenStrs()[0] != "<|im_start|>" {
		t.Fatalf("unexpected tokens: %v", reply)
	}
	text, err := c.Tokenization.Detokenize(ctx, &millmv1.DetokenizeRequest{
		Model: "millm-tiny", Tokens: reply.GetTokens()})
	if err != nil {
		t.Fatal(err)
	}
	if text.GetPrompt() != "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n" {
		t.Fatalf("unexpected text: %q", text.GetPrompt())
	}
	_, err = c.Tokenization.Detokenize(ctx, &millmv1.DetokenizeRequest{
		Model: "millm-tiny", Tokens: []int64{1, 10000000}})
	if code, param := ErrorCode(err); code != "invalid_parameter" || param != "tokens[1]" {
		t.Fatalf("want invalid_parameter/tokens[1], got %q/%q", code, param)
	}
}
