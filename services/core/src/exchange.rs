//! The typed exchange: what an answer is, whichever API shape it came in or goes out in.
//!
//! Each provider adapter parses its own wire format into these types (a whole answer into an
//! [`Answer`], each stream event into [`Delta`]s), and each caller shape renders them into its
//! own. The pipeline — output guardrails, tool RBAC, the stream's commit point, resume and
//! accounting — reads only these, so it holds for every shape. What one shape has that
//! another lacks is a variant here (thinking and its signature, for instance) or dropped by
//! the renderer that has no place for it, by a rule stated in that renderer.

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// It finished its turn (or met a stop sequence).
    EndTurn,
    /// It ran out of output tokens.
    MaxTokens,
    /// It asks for tool calls.
    ToolUse,
    /// It (or a filter at the provider) refused.
    Refusal,
}

/// One content block of an answer, in the order the model produced it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    Text(String),
    /// Visible reasoning, with the signature a provider needs to accept it back next turn.
    Thinking {
        thinking: String,
        signature: String,
    },
    /// Reasoning the provider returns encrypted, whole.
    RedactedThinking(String),
    /// A tool call; `input` is the arguments as JSON text.
    ToolUse {
        id: String,
        name: String,
        input: String,
    },
}

/// A whole answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Answer {
    /// The provider's id for it (empty when it gave none).
    pub id: String,
    pub blocks: Vec<Block>,
    /// `None` when the provider did not say.
    pub stop: Option<Stop>,
}

impl Answer {
    /// What the output guardrails read: the text and the thinking (both reach some caller).
    pub fn text(&self) -> String {
        let mut text = String::new();
        for block in &self.blocks {
            let part = match block {
                Block::Text(part) => part,
                Block::Thinking { thinking, .. } => thinking,
                _ => continue,
            };
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(part);
        }
        text
    }

    /// The tools the answer asks to call (what tool RBAC reads).
    pub fn tool_names(&self) -> Vec<String> {
        self.blocks
            .iter()
            .filter_map(|block| match block {
                Block::ToolUse { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect()
    }

    /// The text blocks joined (the answer's visible text).
    pub fn visible_text(&self) -> String {
        self.blocks
            .iter()
            .filter_map(|block| match block {
                Block::Text(text) => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// One piece of a streamed answer. A stream is a sequence of these in the order the model
/// produced them; a renderer opens and closes its shape's blocks as the kind changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// More assistant text.
    Text(String),
    /// A thinking block opens; its text and signature follow.
    ThinkingStart,
    Thinking(String),
    Signature(String),
    /// A redacted thinking block, whole.
    RedactedThinking(String),
    /// A tool call opens: `index` numbers the answer's calls from 0.
    ToolCall {
        index: u32,
        id: String,
        name: String,
    },
    /// More of call `index`'s arguments (JSON text, in pieces).
    ToolArguments {
        index: u32,
        json: String,
    },
    /// The model stopped, and why.
    Stop(Stop),
}

impl Delta {
    /// The text this delta adds that a reader sees (assistant text or thinking).
    pub fn text(&self) -> Option<&str> {
        match self {
            Delta::Text(text) | Delta::Thinking(text) => Some(text),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_reads_its_text_thinking_and_tools() {
        let answer = Answer {
            id: "m1".into(),
            blocks: vec![
                Block::Thinking { thinking: "hm".into(), signature: "s".into() },
                Block::Text("42".into()),
                Block::ToolUse { id: "t".into(), name: "search".into(), input: "{}".into() },
            ],
            stop: Some(Stop::ToolUse),
        };
        assert_eq!(answer.text(), "hm\n42");
        assert_eq!(answer.visible_text(), "42");
        assert_eq!(answer.tool_names(), ["search"]);
    }
}
