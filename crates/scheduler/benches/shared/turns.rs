//! The conversations both multi-turn benchmarks hold (the scheduler's `multiturn` bench and the
//! HTTP `chat_turns`), so that their figures compare.

/// The system message every conversation starts with.
pub const SYSTEM: &str = "You are a helpful writing assistant. Answer briefly.";

/// The user's message of `turn` in conversation `c`: about 150 tokens, different per turn and
/// conversation.
pub fn user_message(c: usize, turn: usize) -> String {
    let topics = [
        "the harbour",
        "the old mill",
        "the night train",
        "the orchard",
        "the lighthouse",
    ];
    let topic = topics[(c + turn) % topics.len()];
    format!(
        "Conversation {c}, question {turn}. I am writing a short story set near {topic}. Here is \
         what I have so far: the morning fog lifted slowly, the bells rang twice, and a stranger \
         with a grey coat asked for directions to {topic}, carrying a letter that nobody in the \
         village could read. The baker said she had seen him before, years ago, when the river \
         flooded and the bridge was closed for a whole winter. Suggest what happens next in two \
         sentences, keeping the tone quiet and a little mysterious, and name one new character."
    )
}
