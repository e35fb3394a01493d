//! The cross-shape matrix (issues 28, 30): each caller shape (`/v1/chat/completions`,
//! `/v1/messages`) × each provider flavor (`openai`, `anthropic`, `gemini`, `bedrock`, and
//! `vertex` with Google's and Anthropic's models) × streamed and not × each
//! kind of content (text, a tool call, a tool result, an image, thinking). Every cell sends one
//! request through the real proxy to the mock and checks both ends: what the caller got, read
//! back into one summary whatever its shape, and what the mock received, in the target's
//! shape. The README's table ("What maps to what") is this test's.

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use shield_e2e::clouds;
use shield_e2e::stack::Stack;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Caller {
    OpenAi,
    Anthropic,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Flavor {
    OpenAi,
    Anthropic,
    Gemini,
    Bedrock,
    VertexGemini,
    VertexClaude,
}

const FLAVORS: [Flavor; 6] =
    [Flavor::OpenAi, Flavor::Anthropic, Flavor::Gemini, Flavor::Bedrock, Flavor::VertexGemini, Flavor::VertexClaude];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Case {
    Text,
    ToolCall,
    ToolResult,
    Image,
    Thinking,
}

/// An answer read back from either shape, streamed or not.
#[derive(Debug, Default)]
struct Summary {
    text: String,
    thinking: String,
    signature: String,
    tools: Vec<(String, Value)>,
    /// In Anthropic's words (`end_turn`, `tool_use`, …), whichever shape said it.
    stop: String,
}

const IMAGE: &str = "iVBORw0KGgo=";

fn target_id(flavor: Flavor, case: Case) -> String {
    let flavor = match flavor {
        Flavor::OpenAi => "o",
        Flavor::Anthropic => "a",
        Flavor::Gemini => "g",
        Flavor::Bedrock => "b",
        Flavor::VertexGemini => "vg",
        Flavor::VertexClaude => "vc",
    };
    format!("mx-{flavor}-{case:?}").to_lowercase()
}

/// The request of a cell in the caller's shape.
fn request(caller: Caller, route: &str, case: Case, stream: bool) -> Value {
    let mut body = match (caller, case) {
        (Caller::OpenAi, Case::ToolResult) => json!({"messages": [
            {"role": "user", "content": "find x"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "search", "arguments": "{\"q\":\"x\"}"}}]},
            {"role": "tool", "tool_call_id": "call_9", "content": "result 42"}]}),
        (Caller::Anthropic, Case::ToolResult) => json!({"messages": [
            {"role": "user", "content": "find x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_9", "name": "search", "input": {"q": "x"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_9", "content": "result 42"}]}]}),
        (Caller::OpenAi, Case::Image) => json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "hello"},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{IMAGE}")}}]}]}),
        (Caller::Anthropic, Case::Image) => json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "hello"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": IMAGE}}]}]}),
        (_, _) => json!({"messages": [{"role": "user", "content": "hello"}]}),
    };
    body["model"] = json!(route);
    body["stream"] = json!(stream);
    body["max_tokens"] = json!(4096);
    if case == Case::ToolCall || case == Case::ToolResult {
        body["tools"] = match caller {
            Caller::OpenAi => json!([{"type": "function", "function": {"name": "search", "parameters": schema()}}]),
            Caller::Anthropic => json!([{"name": "search", "input_schema": schema()}]),
        };
    }
    if case == Case::Thinking {
        match caller {
            Caller::OpenAi => body["reasoning_effort"] = json!("low"),
            Caller::Anthropic => body["thinking"] = json!({"type": "enabled", "budget_tokens": 2048}),
        }
    }
    body
}

/// An OpenAI-shaped answer or stream, summarised.
fn openai_summary(text: &str, stream: bool) -> Summary {
    let mut summary = Summary::default();
    let stop = |finish: &str| match finish {
        "tool_calls" => "tool_use",
        "length" => "max_tokens",
        _ => "end_turn",
    };
    if !stream {
        let answer: Value = serde_json::from_str(text).unwrap();
        let message = &answer["choices"][0]["message"];
        summary.text = message["content"].as_str().unwrap_or_default().to_string();
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            let input = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
            summary.tools.push((call["function"]["name"].as_str().unwrap().to_string(), input));
        }
        summary.stop = stop(answer["choices"][0]["finish_reason"].as_str().unwrap()).to_string();
        return summary;
    }
    let mut arguments: Vec<String> = Vec::new();
    for data in text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]") {
        let chunk: Value = serde_json::from_str(data).unwrap();
        let Some(choice) = chunk["choices"].get(0) else { continue };
        summary.text.push_str(choice["delta"]["content"].as_str().unwrap_or_default());
        for call in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap() as usize;
            if let Some(name) = call["function"]["name"].as_str() {
                summary.tools.push((name.to_string(), Value::Null));
                arguments.push(String::new());
            }
            arguments[index].push_str(call["function"]["arguments"].as_str().unwrap_or_default());
        }
        if let Some(finish) = choice["finish_reason"].as_str() {
            summary.stop = stop(finish).to_string();
        }
    }
    for (tool, arguments) in summary.tools.iter_mut().zip(arguments) {
        tool.1 = serde_json::from_str(&arguments).unwrap();
    }
    summary
}

/// An Anthropic-shaped message or event stream, summarised.
fn anthropic_summary(text: &str, stream: bool) -> Summary {
    let mut summary = Summary::default();
    let read_block = |block: &Value, summary: &mut Summary| match block["type"].as_str() {
        Some("text") => summary.text.push_str(block["text"].as_str().unwrap()),
        Some("thinking") => {
            summary.thinking.push_str(block["thinking"].as_str().unwrap());
            summary.signature.push_str(block["signature"].as_str().unwrap_or_default());
        }
        Some("tool_use") => summary.tools.push((block["name"].as_str().unwrap().to_string(), block["input"].clone())),
        _ => {}
    };
    if !stream {
        let message: Value = serde_json::from_str(text).unwrap();
        for block in message["content"].as_array().unwrap() {
            read_block(block, &mut summary);
        }
        summary.stop = message["stop_reason"].as_str().unwrap().to_string();
        return summary;
    }
    let mut arguments = String::new();
    for event in text.split("\n\n").filter(|e| !e.trim().is_empty()) {
        let data = event.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
        let event: Value = serde_json::from_str(data).unwrap();
        match event["type"].as_str().unwrap() {
            "content_block_start" => read_block(&event["content_block"], &mut summary),
            "content_block_delta" => {
                let delta = &event["delta"];
                match delta["type"].as_str().unwrap() {
                    "text_delta" => summary.text.push_str(delta["text"].as_str().unwrap()),
                    "thinking_delta" => summary.thinking.push_str(delta["thinking"].as_str().unwrap()),
                    "signature_delta" => summary.signature.push_str(delta["signature"].as_str().unwrap()),
                    "input_json_delta" => arguments.push_str(delta["partial_json"].as_str().unwrap()),
                    other => panic!("unexpected delta {other}"),
                }
            }
            "content_block_stop" => {
                if let Some(tool) = summary.tools.last_mut().filter(|_| !arguments.is_empty()) {
                    tool.1 = serde_json::from_str(&std::mem::take(&mut arguments)).unwrap();
                }
            }
            "message_delta" => summary.stop = event["delta"]["stop_reason"].as_str().unwrap().to_string(),
            _ => {}
        }
    }
    summary
}

async fn send(stack: &Stack, key: &str, caller: Caller, body: &Value) -> (StatusCode, HeaderMap, String) {
    let path = match caller {
        Caller::OpenAi => "/v1/chat/completions",
        Caller::Anthropic => "/v1/messages",
    };
    let response =
        stack.client.post(format!("http://{}{path}", stack.proxy)).bearer_auth(key).json(body).send().await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    let text = response.text().await.unwrap();
    stack.evidence.response(&format!("POST proxy {path}"), status, &headers, &text);
    (status, headers, text)
}

/// What the mock received for the cell, in the target's shape.
fn check_received(flavor: Flavor, caller: Caller, case: Case, sent: &Value, headers: &HeaderMap) {
    let flavor = match flavor {
        Flavor::Gemini | Flavor::VertexGemini => return check_gemini_received(caller, case, sent, headers),
        Flavor::Bedrock => return check_bedrock_received(case, sent, headers),
        // Claude on Vertex takes the Messages body, with Vertex's version and no model.
        Flavor::VertexClaude => {
            assert_eq!(sent["anthropic_version"], "vertex-2023-10-16");
            assert!(sent.get("model").is_none());
            Flavor::Anthropic
        }
        other => other,
    };
    let messages = sent["messages"].as_array().unwrap();
    match (flavor, case) {
        (Flavor::OpenAi, Case::ToolResult) => {
            let tool = messages.iter().find(|m| m["role"] == "tool").expect("a tool message");
            assert_eq!((tool["tool_call_id"].as_str(), tool["content"].as_str()), (Some("call_9"), Some("result 42")));
            let call = messages.iter().find(|m| m["role"] == "assistant").unwrap();
            assert_eq!(call["tool_calls"][0]["function"]["name"], "search");
        }
        (Flavor::Anthropic, Case::ToolResult) => {
            let last = &messages.last().unwrap()["content"];
            let result = last.as_array().unwrap().iter().find(|b| b["type"] == "tool_result").expect("a tool_result");
            assert_eq!(result["tool_use_id"], "call_9");
            assert!(result["content"].to_string().contains("result 42"), "{result}");
            assert_eq!(messages[1]["content"][0]["type"], "tool_use");
        }
        (Flavor::OpenAi, Case::Image) => {
            let url = &messages[0]["content"][1]["image_url"]["url"];
            assert_eq!(url, &json!(format!("data:image/png;base64,{IMAGE}")));
        }
        (Flavor::Anthropic, Case::Image) => {
            assert_eq!(
                messages[0]["content"][1]["source"],
                json!({"type": "base64", "media_type": "image/png", "data": IMAGE})
            );
        }
        (Flavor::OpenAi, Case::Thinking) => {
            assert_eq!(sent["reasoning_effort"], "low", "{caller:?}: thinking as the target's reasoning control");
            assert!(sent.get("thinking").is_none());
        }
        (Flavor::Anthropic, Case::Thinking) => match caller {
            Caller::Anthropic => assert_eq!(sent["thinking"], json!({"type": "enabled", "budget_tokens": 2048})),
            // An OpenAI caller's reasoning_effort has no Messages field: dropped, and named.
            Caller::OpenAi => {
                assert!(sent.get("thinking").is_none() && sent.get("reasoning_effort").is_none());
                assert_eq!(headers["x-shield-dropped-fields"], "reasoning_effort");
            }
        },
        (Flavor::OpenAi, Case::ToolCall) => assert_eq!(sent["tools"][0]["function"]["parameters"], schema()),
        (Flavor::Anthropic, Case::ToolCall) => assert_eq!(sent["tools"][0]["input_schema"], schema()),
        _ => {}
    }
    if !(flavor == Flavor::Anthropic && caller == Caller::OpenAi && case == Case::Thinking) {
        assert!(headers.get("x-shield-dropped-fields").is_none(), "nothing dropped: {headers:?}");
    }
}

/// The tool's input schema every cell sends: it must reach every target as sent (Shield keeps
/// it as text and writes it into other shapes as it is).
fn schema() -> Value {
    json!({"type": "object", "properties": {"q": {"type": "string", "description": "the \"query\"\n, é"},
        "n": {"type": "integer", "minimum": 1}}, "required": ["q"], "additionalProperties": false})
}

/// What a Gemini target received for the cell, in its shape.
fn check_gemini_received(caller: Caller, case: Case, sent: &Value, headers: &HeaderMap) {
    let contents = sent["contents"].as_array().unwrap();
    match case {
        Case::ToolResult => {
            let call = &contents[1]["parts"][0]["functionCall"];
            assert_eq!((contents[1]["role"].as_str(), call["name"].as_str()), (Some("model"), Some("search")));
            let result = &contents.last().unwrap()["parts"][0]["functionResponse"];
            assert_eq!(result, &json!({"id": "call_9", "name": "search", "response": {"content": "result 42"}}));
        }
        Case::Image => {
            assert_eq!(contents[0]["parts"][1], json!({"inlineData": {"mimeType": "image/png", "data": IMAGE}}))
        }
        Case::Thinking => assert_eq!(
            sent["generationConfig"]["thinkingConfig"],
            json!({"thinkingBudget": 2048, "includeThoughts": true}),
            "{caller:?}: a low effort (or a 2,048-token budget) as Gemini's thinking budget, within half the cap"
        ),
        Case::ToolCall => assert_eq!(sent["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"], schema()),
        Case::Text => {}
    }
    assert!(headers.get("x-shield-dropped-fields").is_none(), "nothing dropped: {headers:?}");
}

/// What a Bedrock target received for the cell, in Converse's shape.
fn check_bedrock_received(case: Case, sent: &Value, headers: &HeaderMap) {
    let messages = sent["messages"].as_array().unwrap();
    match case {
        Case::ToolResult => {
            let call = &messages[1]["content"][0]["toolUse"];
            assert_eq!((messages[1]["role"].as_str(), call["name"].as_str()), (Some("assistant"), Some("search")));
            assert_eq!(
                messages.last().unwrap()["content"][0]["toolResult"],
                json!({"toolUseId": "call_9", "content": [{"text": "result 42"}], "status": "success"})
            );
        }
        Case::Image => {
            assert_eq!(messages[0]["content"][1], json!({"image": {"format": "png", "source": {"bytes": IMAGE}}}))
        }
        Case::Thinking => {
            let thinking = &sent["additionalModelRequestFields"]["thinking"];
            let budget = thinking["budget_tokens"].as_u64().unwrap();
            assert!(thinking["type"] == "enabled" && (1024..4096).contains(&budget), "{sent}");
        }
        Case::ToolCall => {
            assert_eq!(sent["toolConfig"]["tools"][0]["toolSpec"]["name"], "search");
            assert_eq!(sent["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"]["json"], schema());
        }
        Case::Text => assert_eq!(messages[0]["content"], json!([{"text": "hello"}])),
    }
    assert!(headers.get("x-shield-dropped-fields").is_none(), "nothing dropped: {headers:?}");
}

/// What the caller got for the cell.
fn check_answer(flavor: Flavor, caller: Caller, case: Case, stream: bool, summary: &Summary) {
    let cell = format!("{caller:?} caller, {flavor:?} target, stream {stream}, {case:?}");
    if case == Case::ToolCall {
        assert_eq!(summary.tools, [("search".to_string(), json!({"q": "mock"}))], "{cell}");
        assert_eq!(summary.stop, "tool_use", "{cell}");
        return;
    }
    let expected = if stream { "mock part1 part2 " } else { "mock answer to: " };
    assert!(summary.text.starts_with(expected), "{cell}: {summary:?}");
    assert_eq!(summary.stop, "end_turn", "{cell}");
    let thinks = flavor != Flavor::OpenAi && case == Case::Thinking;
    match (thinks, caller) {
        // Thinking and its signature reach a caller of the shape that has them, as blocks
        // (Gemini signs calls, not thoughts: its thought comes unsigned).
        (true, Caller::Anthropic) => {
            let signature = match flavor {
                Flavor::Gemini | Flavor::VertexGemini => "",
                Flavor::Bedrock => "YmVkcm9jay1zaWc=",
                _ => "c2ln",
            };
            assert_eq!((summary.thinking.as_str(), summary.signature.as_str()), ("Let me think.", signature), "{cell}")
        }
        // And never leak into the text of a shape that has no place for them.
        _ => assert!(summary.thinking.is_empty() && !summary.text.contains("Let me think"), "{cell}: {summary:?}"),
    }
}

#[tokio::test]
async fn every_caller_shape_reaches_every_flavor_with_every_kind_of_content() {
    let stack = Stack::start().await;
    clouds::aws_keys(&stack, "aws").await;
    clouds::service_account(&stack, "gcp", None).await;
    let cases = [Case::Text, Case::ToolCall, Case::ToolResult, Case::Image, Case::Thinking];
    for flavor in FLAVORS {
        for case in cases {
            let scenario = match case {
                Case::ToolCall => "tool:search",
                Case::Thinking if flavor != Flavor::OpenAi => "think",
                _ => "",
            };
            let id = target_id(flavor, case);
            let extra = match flavor {
                Flavor::OpenAi => json!({"capabilities": {"reasoning": true}}),
                Flavor::Anthropic => json!({"flavor": "anthropic"}),
                Flavor::Gemini => json!({"flavor": "gemini", "capabilities": {"reasoning": true},
                    "base_url": format!("http://{}/mock/id:{id};{scenario}/v1beta", stack.mock)}),
                Flavor::Bedrock => json!({"flavor": "bedrock", "capabilities": {"reasoning": true},
                    "model": "anthropic.claude-sonnet-4-20250514-v1:0", "bedrock": {"region": "us-east-1"},
                    "base_url": format!("http://{}/mock/id:{id};{scenario}", stack.mock),
                    "auth": {"mode": "vault", "secret_ref": "shield://aws"}}),
                Flavor::VertexGemini | Flavor::VertexClaude => {
                    let (publisher, model, reasoning) = match flavor {
                        Flavor::VertexGemini => ("google", "gemini-2.5-flash", true),
                        _ => ("anthropic", "claude-sonnet-4@20250514", false),
                    };
                    json!({"flavor": "vertex", "vertex": {"publisher": publisher}, "model": model,
                        "capabilities": {"reasoning": reasoning},
                        "base_url": format!("http://{}/mock/id:{id};{scenario}/v1/projects/p/locations/us-east5", stack.mock),
                        "auth": {"mode": "vault", "secret_ref": "shield://gcp"}})
                }
            };
            stack.mock_target(&id, scenario, extra).await;
            stack.put_route(&id, json!({"targets": [id]})).await;
        }
    }
    let (key, _) = stack.key(None).await;
    let mut cells = 0;
    for caller in [Caller::OpenAi, Caller::Anthropic] {
        for flavor in FLAVORS {
            for stream in [false, true] {
                for case in cases {
                    let route = target_id(flavor, case);
                    let body = request(caller, &route, case, stream);
                    let (status, headers, text) = send(&stack, &key, caller, &body).await;
                    let cell = format!("{caller:?} caller, {flavor:?} target, stream {stream}, {case:?}");
                    assert_eq!(status, StatusCode::OK, "{cell}: {text}");
                    let summary = match caller {
                        Caller::OpenAi => openai_summary(&text, stream),
                        Caller::Anthropic => anthropic_summary(&text, stream),
                    };
                    check_answer(flavor, caller, case, stream, &summary);
                    let received = stack.received(&route).await;
                    let sent: Value = serde_json::from_str(received.last().unwrap()["body"].as_str().unwrap()).unwrap();
                    check_received(flavor, caller, case, &sent, &headers);
                    cells += 1;
                }
            }
        }
    }
    assert_eq!(cells, 120);
}
