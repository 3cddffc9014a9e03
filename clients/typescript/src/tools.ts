// Chat requests with tools, and a generation's responses folded into texts,
// finish reasons and whole tool calls (streamed ToolCallDelta fragments joined).
import {
  ChatMessage, FinishReason, FunctionTool, Role, SamplingParams, ToolCall, ToolCallDelta,
  ToolChoice, ToolChoiceMode,
} from "./gen/millm/v1/generation";
import { GenerateRequest, GenerateResponse } from "./gen/millm/v1/generation_service";

/** A function the model may call; `parameters` is a JSON Schema object (or its JSON text). */
export interface ToolSpec {
  name: string;
  description?: string;
  parameters?: object | string;
  strict?: boolean;
}

/** A whole tool call; `arguments` is a JSON object as text. */
export interface FunctionCall {
  id: string;
  name: string;
  arguments: string;
}

export type RoleName = "system" | "developer" | "user" | "assistant" | "tool" | "function";

/** A chat message: an assistant's `toolCalls` (arguments as JSON text or an object), or
 * a tool message answering the call `toolCallId`. */
export interface Message {
  role: RoleName | Role;
  content?: string;
  name?: string;
  toolCalls?: { id: string; name: string; arguments: string | object }[];
  toolCallId?: string;
}

/** "none", "auto", "required", or the name of the one function to call. */
export type ToolChoiceInput = "none" | "auto" | "required" | (string & {});

export interface ChatOptions {
  tools?: ToolSpec[];
  toolChoice?: ToolChoiceInput;
  /** Whether a choice may hold several calls (engine default: true). */
  parallelToolCalls?: boolean;
  sampling?: Partial<SamplingParams>;
}

const ROLES: Record<RoleName, Role> = {
  system: Role.ROLE_SYSTEM, developer: Role.ROLE_DEVELOPER, user: Role.ROLE_USER,
  assistant: Role.ROLE_ASSISTANT, tool: Role.ROLE_TOOL, function: Role.ROLE_FUNCTION,
};

const MODES = new Map<string, ToolChoiceMode>([
  ["none", ToolChoiceMode.TOOL_CHOICE_MODE_NONE],
  ["auto", ToolChoiceMode.TOOL_CHOICE_MODE_AUTO],
  ["required", ToolChoiceMode.TOOL_CHOICE_MODE_REQUIRED],
]);

function jsonText(value: object | string | undefined): string {
  if (value === undefined) return "";
  return typeof value === "string" ? value : JSON.stringify(value);
}

export function functionTool(spec: ToolSpec): FunctionTool {
  return FunctionTool.fromPartial({
    name: spec.name, description: spec.description ?? "",
    parametersJson: jsonText(spec.parameters), strict: spec.strict,
  });
}

export function toolChoice(choice: ToolChoiceInput): ToolChoice {
  const mode = MODES.get(choice);
  return mode !== undefined ? ToolChoice.fromPartial({ mode })
    : ToolChoice.fromPartial({ mode: ToolChoiceMode.TOOL_CHOICE_MODE_FUNCTION, functionName: choice });
}

export function chatMessage(message: Message): ChatMessage {
  return ChatMessage.fromPartial({
    role: typeof message.role === "string" ? ROLES[message.role] : message.role,
    content: message.content ?? "",
    name: message.name ?? "",
    toolCalls: (message.toolCalls ?? []).map((c): ToolCall =>
      ({ id: c.id, name: c.name, argumentsJson: jsonText(c.arguments) })),
    toolCallId: message.toolCallId ?? "",
  });
}

/** The GenerateRequest of a conversation, for MillmClient.generate(). */
export function chatRequest(model: string, messages: Message[], options: ChatOptions = {}):
  GenerateRequest {
  return GenerateRequest.fromPartial({
    model,
    chat: { messages: messages.map(chatMessage) },
    sampling: options.sampling ?? {},
    tools: (options.tools ?? []).map(functionTool),
    toolChoice: options.toolChoice === undefined ? undefined : toolChoice(options.toolChoice),
    parallelToolCalls: options.parallelToolCalls,
  });
}

/** One choice's calls after `fragments`: a fragment at the next index starts a call (id and
 * name), one at a known index appends to its arguments. Throws on a skipped index. */
export function foldToolCalls(calls: FunctionCall[], fragments: ToolCallDelta[]): FunctionCall[] {
  const out = calls.map((c) => ({ ...c }));
  for (const f of fragments) {
    if (f.index === out.length) {
      out.push({ id: f.id, name: f.name, arguments: f.arguments });
    } else if (f.index >= 0 && f.index < out.length) {
      const call = out[f.index];
      call.id ||= f.id;
      call.name ||= f.name;
      call.arguments += f.arguments;
    } else {
      throw new Error(`tool call fragment for index ${f.index} before index ${out.length} started`);
    }
  }
  return out;
}

export type FinishReasonName = "stop" | "length" | "tool_calls";

export function finishReason(reason: FinishReason): FinishReasonName | undefined {
  switch (reason) {
    case FinishReason.FINISH_REASON_STOP: return "stop";
    case FinishReason.FINISH_REASON_LENGTH: return "length";
    case FinishReason.FINISH_REASON_TOOL_CALLS: return "tool_calls";
    default: return undefined;
  }
}

/** A generation's responses folded together, per choice index. */
export class Generation {
  id = "";
  model = "";
  texts: Record<number, string> = {};
  finishReasons: Record<number, FinishReasonName> = {};
  toolCalls: Record<number, FunctionCall[]> = {};
  promptTokens = 0;
  completionTokens = 0;

  /** Folds one response in (call it on each response of a stream). */
  add(response: GenerateResponse): void {
    if (response.metadata) {
      this.id = response.metadata.id;
      this.model = response.metadata.model;
    }
    for (const d of response.choices) {
      this.texts[d.index] = (this.texts[d.index] ?? "") + d.text;
      if (d.toolCalls.length) {
        this.toolCalls[d.index] = foldToolCalls(this.toolCalls[d.index] ?? [], d.toolCalls);
      }
      const reason = finishReason(d.finishReason);
      if (reason) this.finishReasons[d.index] = reason;
    }
    if (response.usage) {
      this.promptTokens = response.usage.promptTokens;
      this.completionTokens = response.usage.completionTokens;
    }
  }

  /** The whole generation of a stream (such as MillmClient.generate()'s). */
  static async collect(responses: AsyncIterable<GenerateResponse>): Promise<Generation> {
    const generation = new Generation();
    for await (const response of responses) generation.add(response);
    return generation;
  }
}
