// A small wrapper over the generated millm.v1 clients: streamed generation as an
// async iterator, promise-based unary calls, API key and request id as call
// metadata, and the OpenAI error code read from google.rpc.ErrorInfo. Tools
// (./tools): chatRequest() builds a chat GenerateRequest with tools, and
// Generation.collect() folds a stream into texts, finish reasons and tool calls.
// tokenize() and detokenize() use the model's own tokenizer (TokenizationService).
import { ChannelCredentials, Metadata, ServiceError, credentials } from "@grpc/grpc-js";
import { BinaryReader } from "@bufbuild/protobuf/wire";
import { GenerateRequest, GenerateResponse, GenerationServiceClient } from "./gen/millm/v1/generation_service";
import { ListModelsResponse, ModelServiceClient } from "./gen/millm/v1/model_service";
import {
  DetokenizeRequest, DetokenizeResponse, TokenizationServiceClient, TokenizeRequest, TokenizeResponse,
} from "./gen/millm/v1/tokenization_service";

export * from "./gen/millm/v1/generation";
export { GenerateRequest, GenerateResponse } from "./gen/millm/v1/generation_service";
export {
  DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse,
} from "./gen/millm/v1/tokenization_service";
export * from "./tools";

/** Any part of a message may be left out (the generated fromPartial fills defaults). */
export type DeepPartial<T> = T extends (infer U)[] ? DeepPartial<U>[]
  : T extends Uint8Array ? T : T extends object ? { [K in keyof T]?: DeepPartial<T[K]> } : T;

export interface CallOptions {
  /** Deadline in seconds. */
  timeout?: number;
  requestId?: string;
}

/** A refused or failed call; `code` is the OpenAI error code (ErrorInfo.reason). */
export class MillmError extends Error {
  constructor(
    message: string,
    public readonly status: number,
    public readonly code?: string,
    public readonly param?: string,
    public readonly httpStatus?: number,
  ) {
    super(message);
  }
}

interface ErrorInfo {
  reason: string;
  metadata: Record<string, string>;
}

// google.rpc.Status { code = 1; message = 2; repeated Any details = 3 },
// Any { type_url = 1; value = 2 }, ErrorInfo { reason = 1; domain = 2; map metadata = 3 }.
function errorInfo(details: Uint8Array): ErrorInfo | undefined {
  const status = new BinaryReader(details);
  while (status.pos < status.len) {
    const [field, wire] = status.tag();
    if (field !== 3) {
      status.skip(wire);
      continue;
    }
    const any = new BinaryReader(status.bytes());
    let typeUrl = "";
    let value: Uint8Array = new Uint8Array();
    while (any.pos < any.len) {
      const [f, w] = any.tag();
      if (f === 1) typeUrl = any.string();
      else if (f === 2) value = any.bytes();
      else any.skip(w);
    }
    if (!typeUrl.endsWith("google.rpc.ErrorInfo")) continue;
    const info: ErrorInfo = { reason: "", metadata: {} };
    const reader = new BinaryReader(value);
    while (reader.pos < reader.len) {
      const [f, w] = reader.tag();
      if (f === 1) info.reason = reader.string();
      else if (f === 3) {
        const entry = new BinaryReader(reader.bytes());
        let key = "";
        let val = "";
        while (entry.pos < entry.len) {
          const [ef, ew] = entry.tag();
          if (ef === 1) key = entry.string();
          else if (ef === 2) val = entry.string();
          else entry.skip(ew);
        }
        info.metadata[key] = val;
      } else reader.skip(w);
    }
    return info;
  }
  return undefined;
}

export function toMillmError(error: ServiceError): MillmError {
  const raw = error.metadata?.get("grpc-status-details-bin")[0];
  const info = raw instanceof Buffer ? errorInfo(new Uint8Array(raw)) : undefined;
  const http = info?.metadata["http_status"];
  return new MillmError(error.details || error.message, error.code, info?.reason,
    info?.metadata["param"], http ? Number(http) : undefined);
}

export class MillmClient {
  private readonly generation: GenerationServiceClient;
  private readonly models: ModelServiceClient;
  private readonly tokenization: TokenizationServiceClient;

  constructor(target: string, private readonly apiKey?: string,
    channelCredentials: ChannelCredentials = credentials.createInsecure()) {
    this.generation = new GenerationServiceClient(target, channelCredentials);
    this.models = new ModelServiceClient(target, channelCredentials);
    this.tokenization = new TokenizationServiceClient(target, channelCredentials);
  }

  private metadata(options: CallOptions): Metadata {
    const metadata = new Metadata();
    if (this.apiKey) metadata.set("authorization", `Bearer ${this.apiKey}`);
    if (options.requestId) metadata.set("x-request-id", options.requestId);
    return metadata;
  }

  private deadline(options: CallOptions): Date {
    return new Date(Date.now() + 1000 * (options.timeout ?? 120));
  }

  /** The responses of one generation, as they arrive. */
  async *generate(request: DeepPartial<GenerateRequest>, options: CallOptions = {}):
    AsyncGenerator<GenerateResponse> {
    const call = this.generation.generate(GenerateRequest.fromPartial(request),
      this.metadata(options), { deadline: this.deadline(options) });
    try {
      for await (const response of call) yield response as GenerateResponse;
    } catch (error) {
      throw toMillmError(error as ServiceError);
    }
  }

  listModels(options: CallOptions = {}): Promise<ListModelsResponse> {
    return new Promise((resolve, reject) => {
      this.models.listModels({}, this.metadata(options), { deadline: this.deadline(options) },
        (error, response) => (error ? reject(toMillmError(error)) : resolve(response)));
    });
  }

  /** The ids a generation of this prompt or conversation would feed the model. */
  tokenize(request: DeepPartial<TokenizeRequest>, options: CallOptions = {}): Promise<TokenizeResponse> {
    return new Promise((resolve, reject) => {
      this.tokenization.tokenize(TokenizeRequest.fromPartial(request), this.metadata(options),
        { deadline: this.deadline(options) },
        (error, response) => (error ? reject(toMillmError(error)) : resolve(response)));
    });
  }

  /** The text of token ids, special tokens written out. */
  detokenize(model: string, tokens: number[], options: CallOptions = {}): Promise<string> {
    return new Promise((resolve, reject) => {
      this.tokenization.detokenize(DetokenizeRequest.fromPartial({ model, tokens }),
        this.metadata(options), { deadline: this.deadline(options) },
        (error, response: DetokenizeResponse) => (error ? reject(toMillmError(error)) : resolve(response.prompt)));
    });
  }

  close(): void {
    this.generation.close();
    this.models.close();
    this.tokenization.close();
  }
}
