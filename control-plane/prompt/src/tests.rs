//! Golden tests: expected prompts written out by hand from SGLang 0.5.23's
//! rules (see the module docs), token ids looked up by their text.

use super::*;
use crate::chat::ChatInput;

fn model() -> PromptTokenizer {
    PromptTokenizer::from_files(fixture::model_files()).expect("fixture model loads")
}

fn id(t: &PromptTokenizer, token: &str) -> u32 {
    t.tokenizer.token_to_id(token).expect("token in vocab")
}

fn chat(t: &PromptTokenizer, body: serde_json::Value) -> Result<Prompt, PromptError> {
    let v: Value = serde_json::from_str(&body.to_string()).expect("json");
    t.prompt("/v1/chat/completions", &v)
}

#[test]
fn text_gets_the_bos_and_byte_level_bpe_merges() {
    let t = model();
    let ids = t
        .tokens("/v1/completions", br#"{"prompt": "the cat"}"#)
        .expect("tokens");
    // "the" -> t + he ("h e" merges before anything else applies); " cat"
    // -> Ġ c at ("Ġ t" needs a t right after the space).
    let want: Vec<u32> = ["<s>", "t", "he", "\u{120}", "c", "at"]
        .iter()
        .map(|s| id(&t, s))
        .collect();
    assert_eq!(ids.ids, want);
    let g = t
        .tokens("/generate", br#"{"text": "the cat", "cache_salt": "s1"}"#)
        .expect("tokens");
    assert_eq!(g.ids, want);
    assert_eq!(g.cache_salt.as_deref(), Some("s1"));
    assert_eq!(
        t.tokens("/generate", br#"{"input_ids": [5, 7]}"#)
            .expect("ids")
            .ids,
        [5, 7]
    );
    assert_eq!(
        t.tokens("/v1/completions", br#"{"prompt": [9]}"#)
            .expect("ids")
            .ids,
        [9]
    );
}

#[test]
fn chat_renders_chatml_and_encodes_without_adding_a_second_bos() {
    let t = model();
    let p = chat(
        &t,
        serde_json::json!({"messages": [
            {"role": "system", "content": "Be brief. "},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}], "name": null},
            {"role": "assistant", "content": null, "tool_calls": null}
        ]}),
    )
    .expect("renders");
    let text = "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n\
                <|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(p, Prompt::Chat(text.into()));
    let ids = t.encode(&p).expect("encodes");
    assert_eq!(ids.iter().filter(|&&i| i == id(&t, "<s>")).count(), 1);
    assert_eq!(ids[0], id(&t, "<s>"));
    assert_eq!(ids[1], id(&t, "<|im_start|>"));
}

#[test]
fn tools_are_dumped_as_pydantic_does_in_the_clients_key_order() {
    let t = model();
    // As text: serde_json's own maps would sort the keys.
    let body = r#"{"messages": [{"role": "user", "content": "q"}], "tools": [{"type": "function",
        "function": {"name": "get", "parameters": {"type": "object", "properties": {"z": {}, "a": {}}}}}]}"#;
    let v: Value = serde_json::from_str(body).expect("json");
    let p = t.prompt("/v1/chat/completions", &v).expect("renders");
    let line = r#"{"type": "function", "function": {"name": "get", "parameters": {"type": "object", "properties": {"z": {}, "a": {}}}, "description": null}, "defer_loading": null}"#;
    let Prompt::Chat(text) = p else {
        panic!("a chat prompt")
    };
    assert!(
        text.contains(&format!("# Tools\n{line}\n<|im_end|>")),
        "{text}"
    );
    // tool_choice "none": no tools block.
    let none = body.replacen('{', r#"{"tool_choice": "none", "#, 1);
    let v: Value = serde_json::from_str(&none).expect("json");
    let Ok(Prompt::Chat(text)) = t.prompt("/v1/chat/completions", &v) else {
        panic!("a chat prompt")
    };
    assert!(!text.contains("# Tools"));
}

#[test]
fn what_a_router_cannot_know_is_unpredictable() {
    let t = model();
    let image = serde_json::json!({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}]});
    assert!(matches!(
        chat(&t, image),
        Err(PromptError::Unpredictable(_))
    ));
    let cont = serde_json::json!({"continue_final_message": true, "messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]});
    assert!(matches!(chat(&t, cont), Err(PromptError::Unpredictable(_))));
    assert!(matches!(
        t.tokens("/v1/completions", br#"{"prompt": ["a", "b"]}"#),
        Err(PromptError::Unpredictable(_))
    ));
    assert!(matches!(
        t.tokens("/v1/completions", b"[1]"),
        Err(PromptError::Invalid(_))
    ));
    assert!(matches!(
        t.tokens("/v1/completions", b"{\"prompt\":"),
        Err(PromptError::Invalid(_))
    ));
    let mut files = fixture::model_files();
    files.chat_template = None;
    let bare = PromptTokenizer::from_files(files).expect("loads");
    assert!(matches!(
        chat(
            &bare,
            serde_json::json!({"messages": [{"role": "user", "content": "a"}]})
        ),
        Err(PromptError::Unpredictable(_))
    ));
}

#[test]
fn template_arguments_and_reasoning_effort_reach_the_template() {
    let template = ChatTemplate::new(
        "{{ enable_thinking }}/{{ thinking }}/{{ x }}{{ raise_exception('no') if fail }}".into(),
        vec![],
    )
    .expect("compiles");
    let body: Value = serde_json::from_str(
        r#"{"messages": [{"role": "user", "content": "a"}], "reasoning_effort": "none",
            "chat_template_kwargs": {"thinking": true, "x": 1}}"#,
    )
    .expect("json");
    let input = ChatInput::from_body(&body, template.content_format()).expect("input");
    // Jinja prints Python's booleans.
    assert_eq!(template.render(&input).expect("renders"), "False/True/1");
    let failing: Value = serde_json::from_str(
        r#"{"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": {"fail": true}}"#,
    )
    .expect("json");
    let input = ChatInput::from_body(&failing, template.content_format()).expect("input");
    assert!(matches!(
        template.render(&input),
        Err(PromptError::Template(_))
    ));
}

#[test]
fn python_string_methods_work_in_templates() {
    let template = ChatTemplate::new(
        "{% for m in messages %}{{ m.content.strip().upper() }}{% if m.content.startswith(' x') %}!{% endif %}{% endfor %}".into(),
        vec![],
    )
    .expect("compiles");
    let body: Value =
        serde_json::from_str(r#"{"messages": [{"role": "user", "content": " xy "}]}"#)
            .expect("json");
    let input = ChatInput::from_body(&body, template.content_format()).expect("input");
    assert_eq!(template.render(&input).expect("renders"), "XY!");
}
