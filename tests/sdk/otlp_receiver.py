"""An OTLP/HTTP trace receiver for the end-to-end tests (issue 31): decodes the protobuf
export requests Shield sends (gzip or not) with OpenTelemetry's own generated classes, and
keeps every span as JSON.

  python3 otlp_receiver.py PORT_FILE [DUMP_FILE]

Listens on 127.0.0.1 on a free port and writes the port to PORT_FILE. POST /v1/traces takes
an ExportTraceServiceRequest; GET /spans answers every span received so far as a JSON list
(name, kind, ids in hex, parent, attributes, status, service.name, scope); DUMP_FILE, when
given, is rewritten with that list after each export (the suite's leak scan reads it).
"""
import gzip
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

SPANS = []
LOCK = threading.Lock()
DUMP = sys.argv[2] if len(sys.argv) > 2 else None


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind is None:
        return None
    return getattr(v, kind)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces":
            self.send_response(404)
            self.end_headers()
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append({
                        "name": span.name,
                        "kind": span.kind,
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "start": span.start_time_unix_nano,
                        "end": span.end_time_unix_nano,
                        "attributes": {a.key: value(a.value) for a in span.attributes},
                        "status": span.status.code,
                        "service": resource.get("service.name"),
                        "resource": resource,
                        "scope": scope_spans.scope.name,
                        "content_type": self.headers.get("content-type"),
                    })
        with LOCK:
            SPANS.extend(spans)
            if DUMP:
                with open(DUMP, "w") as f:
                    json.dump(SPANS, f)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def do_GET(self):
        with LOCK:
            reply = json.dumps(SPANS).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
server.serve_forever()
