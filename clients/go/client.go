// Package client is a small wrapper over the generated millm.v1 Go stubs:
// dialing, the API key and request id as call metadata, and the OpenAI error
// code read from the google.rpc.ErrorInfo in a refusal's status details.
// Tokenization is the model's own tokenizer (Tokenize, Detokenize).
package client

import (
	"context"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"millm.ai/client/millmv1"
)

// Client holds one connection and the service stubs.
type Client struct {
	conn       *grpc.ClientConn
	apiKey     string
	Generation millmv1.GenerationServiceClient
	Models     millmv1.ModelServiceClient
	Server     millmv1.ServerServiceClient
	// Tokenization turns prompts and conversations into the ids generation
	// feeds the model, and ids back into text.
	Tokenization millmv1.TokenizationServiceClient
}

// Dial connects to an engine; pass grpc.WithInsecure() or TLS credentials in opts.
func Dial(target, apiKey string, opts ...grpc.DialOption) (*Client, error) {
	conn, err := grpc.Dial(target, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{
		conn:         conn,
		apiKey:       apiKey,
		Generation:   millmv1.NewGenerationServiceClient(conn),
		Models:       millmv1.NewModelServiceClient(conn),
		Server:       millmv1.NewServerServiceClient(conn),
		Tokenization: millmv1.NewTokenizationServiceClient(conn),
	}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Context adds the API key and a request id to ctx's outgoing metadata.
func (c *Client) Context(ctx context.Context, requestID string) context.Context {
	pairs := []string{}
	if c.apiKey != "" {
		pairs = append(pairs, "authorization", "Bearer "+c.apiKey)
	}
	if requestID != "" {
		pairs = append(pairs, "x-request-id", requestID)
	}
	return metadata.AppendToOutgoingContext(ctx, pairs...)
}

// ErrorCode is the OpenAI error code and param of a refusal ("" when the
// status carries no ErrorInfo).
func ErrorCode(err error) (code string, param string) {
	st, ok := status.FromError(err)
	if !ok {
		return "", ""
	}
	for _, detail := range st.Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok {
			return info.GetReason(), info.GetMetadata()["param"]
		}
	}
	return "", ""
}
