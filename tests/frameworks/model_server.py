"""A scripted OpenAI-compatible model: /v1/chat/completions, plain and streamed (with
usage). The reply to a request is the script's step number n, where n is the number of
assistant turns already in the request's messages (the last step repeats); a request
whose messages hold the script's `hint_marker` gets the `after_hint` steps instead;
each reply waits `latency_s`, as a model would."""
import json, sys, time, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SCRIPT = {"steps": [{"text": "done"}]}

def step_for(messages):
    turns = sum(1 for m in messages if m.get("role") == "assistant")
    steps = SCRIPT["steps"]
    marker = SCRIPT.get("hint_marker")
    if marker and SCRIPT.get("after_hint") and any(marker in json.dumps(m.get("content")) for m in messages):
        steps = SCRIPT["after_hint"]
    time.sleep(SCRIPT.get("latency_s", 0))
    return steps[min(turns, len(steps) - 1)], turns

class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path.endswith("/chat/completions"):
            return self.chat(body)
        self.send_response(404); self.end_headers()

    def chat(self, body):
        step, n = step_for(body.get("messages", []))
        usage = {"prompt_tokens": 100 + 10 * n, "completion_tokens": 20, "total_tokens": 120 + 10 * n}
        calls = [{"id": f"call_{n}_{i}", "type": "function",
                  "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}))}}
                 for i, c in enumerate(step.get("tool_calls", []))]
        msg = {"role": "assistant", "content": step.get("text")}
        if calls: msg["tool_calls"] = calls
        finish = "tool_calls" if calls else "stop"
        if not body.get("stream"):
            out = {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()),
                   "model": body.get("model", "scripted"),
                   "choices": [{"index": 0, "message": msg, "finish_reason": finish}], "usage": usage}
            data = json.dumps(out).encode()
            self.send_response(200); self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data))); self.end_headers(); self.wfile.write(data)
            return
        self.send_response(200); self.send_header("content-type", "text/event-stream"); self.end_headers()
        def chunk(delta, finish=None, usage=None):
            c = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": int(time.time()),
                 "model": body.get("model", "scripted"),
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if delta is not None else []}
            if usage: c["usage"] = usage
            self.wfile.write(b"data: " + json.dumps(c).encode() + b"\n\n")
        chunk({"role": "assistant", "content": step.get("text") or ""})
        if calls:
            chunk({"tool_calls": [dict(c, index=i) for i, c in enumerate(calls)]})
        chunk({}, finish)
        if (body.get("stream_options") or {}).get("include_usage"):
            chunk(None, usage=usage)
        self.wfile.write(b"data: [DONE]\n\n")

def serve(script, port=0):
    global SCRIPT
    SCRIPT = script
    srv = ThreadingHTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv

if __name__ == "__main__":
    srv = serve(json.load(open(sys.argv[1])), int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    print(srv.server_address[1], flush=True)
    threading.Event().wait()
