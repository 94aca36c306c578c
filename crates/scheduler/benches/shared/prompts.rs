//! The prompts both benchmarks send (the scheduler's `decode` bench and the HTTP `loadgen`),
//! so that their figures compare: stream `i` takes `PROMPTS[i % PROMPTS.len()]`.

/// Varied prompts that ask for long answers.
pub const PROMPTS: [&str; 8] = [
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in detail how a hash map works, including collisions and resizing.",
    "Describe the water cycle step by step for a school textbook.",
    "Write a detailed travel guide for a weekend in Paris.",
    "Explain how photosynthesis works, with all of its stages.",
    "Write an essay about the history of the printing press.",
    "Give a long list of tips for learning to play the guitar, with explanations.",
    "Describe how a car engine works, part by part.",
];
