"""Google ADK's model calls sent to the scripted OpenAI-compatible model
(`model_server.py`) over HTTP, as ADK's own `LiteLlm` sends them (with a dependency the
ADK virtualenv does not pin): each request is what ADK built, a plugin's hint included,
and the reply is read back as a Gemini-style response that says why it ended."""

import asyncio
import json
import urllib.request

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.genai import types
from loopwarden_guard import STOP_PREFIX


def openai_messages(contents):
    """ADK's request contents as Chat Completions messages: one a content (a model turn
    with its text and calls, a user turn with its text, each tool result its own)."""
    messages = []
    for c in contents:
        parts = c.parts or []
        text = "".join(p.text for p in parts if p.text)
        if c.role == "model":
            calls = [
                {"id": p.function_call.id, "type": "function",
                 "function": {"name": p.function_call.name, "arguments": json.dumps(p.function_call.args)}}
                for p in parts if p.function_call
            ]
            messages.append({"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})})
            continue
        for p in parts:
            if p.function_response:
                messages.append({"role": "tool", "tool_call_id": p.function_response.id,
                                 "content": json.dumps(p.function_response.response)})
        if text:
            messages.append({"role": "user", "content": text})
    return messages


class ServedModel(BaseLlm):
    """A model whose calls go to the Chat Completions endpoint `base_url`."""

    base_url: str

    async def generate_content_async(self, llm_request, stream=False):
        body = json.dumps({"model": self.model, "messages": openai_messages(llm_request.contents)}).encode()
        post = urllib.request.Request(f"{self.base_url}/chat/completions", body, {"content-type": "application/json"})
        reply = await asyncio.to_thread(lambda: json.load(urllib.request.urlopen(post, timeout=30)))
        message = reply["choices"][0]["message"]
        parts = [types.Part(text=message["content"])] if message.get("content") else []
        for call in message.get("tool_calls") or []:
            fc = types.FunctionCall(id=call["id"], name=call["function"]["name"], args=json.loads(call["function"]["arguments"]))
            parts.append(types.Part(function_call=fc))
        usage = reply.get("usage") or {}
        tokens = types.GenerateContentResponseUsageMetadata(
            prompt_token_count=usage.get("prompt_tokens"), candidates_token_count=usage.get("completion_tokens")
        )
        # Gemini's API says why a response ended: ADK then ends the model call's span
        # before it runs the calls.
        yield LlmResponse(
            content=types.Content(role="model", parts=parts), usage_metadata=tokens, finish_reason=types.FinishReason.STOP
        )


async def run(agent, plugin, session_id, text="fix the bug", app_name="app"):
    """One run of `agent` in a new session `session_id`, with `plugin`: its last event."""
    from google.adk.runners import InMemoryRunner

    runner = InMemoryRunner(agent=agent, app_name=app_name, plugins=[plugin])
    await runner.session_service.create_session(app_name=app_name, user_id="user", session_id=session_id)
    message = types.Content(role="user", parts=[types.Part(text=text)])
    last = None
    async for event in runner.run_async(user_id="user", session_id=session_id, new_message=message):
        last = event
    return last


def said(event):
    """The text of an ADK event (a run's last: the stop message, where the guard ended it)."""
    return "".join(p.text or "" for p in (event.content.parts or [])) if event and event.content else ""


def stopped_by_guard(event):
    """Whether a run's last event says the guard ended it: its stop message, or ADK's abort
    (the termination arrived while the run was under way)."""
    return said(event).startswith(STOP_PREFIX) or getattr(event, "error_code", None) == "INVOCATION_ABORTED"
