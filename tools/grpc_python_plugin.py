"""A protoc plugin that runs grpcio-tools' gRPC Python generator.

buf sends a CodeGeneratorRequest on stdin. We write its descriptors to a
descriptor set, run the protoc bundled in grpcio-tools with --grpc_python_out,
and answer a CodeGeneratorResponse holding the files it wrote.
"""

import pathlib
import sys
import tempfile

from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2
from grpc_tools import protoc


def main() -> int:
    request = plugin_pb2.CodeGeneratorRequest.FromString(sys.stdin.buffer.read())
    response = plugin_pb2.CodeGeneratorResponse()
    response.supported_features = plugin_pb2.CodeGeneratorResponse.FEATURE_PROTO3_OPTIONAL
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        descriptor_set = descriptor_pb2.FileDescriptorSet(file=request.proto_file)
        (root / "set.pb").write_bytes(descriptor_set.SerializeToString())
        out = root / "out"
        out.mkdir()
        args = ["protoc", f"--descriptor_set_in={root / 'set.pb'}", f"--grpc_python_out={out}"]
        if protoc.main(args + list(request.file_to_generate)) != 0:
            response.error = "grpcio-tools protoc failed"
        else:
            for path in sorted(out.rglob("*.py")):
                generated = response.file.add()
                generated.name = str(path.relative_to(out))
                generated.content = path.read_text()
    sys.stdout.buffer.write(response.SerializeToString())
    return 0


if __name__ == "__main__":
    sys.exit(main())
