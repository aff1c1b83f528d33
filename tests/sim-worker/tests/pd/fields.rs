//! The bootstrap fields beyond one room: a null port, batches with a room
//! per item, DP ranks, and logprobs split between the two halves.

use super::*;

#[tokio::test]
async fn null_port_means_the_decodes_own_bootstrap_port() {
    let prefill = start(config(DisaggregationMode::Prefill, 5000, 1)).await;
    let port = bootstrap_port(&prefill).await;
    let decode = start(SimConfig {
        disaggregation_bootstrap_port: port,
        ..config(DisaggregationMode::Decode, 5000, 1)
    })
    .await;
    let body = with_bootstrap(&chat_body(2), "127.0.0.1", Value::Null, json!(91));
    let (p, d) = tokio::join!(
        prefill.post("/v1/chat/completions", body.clone()),
        decode.post("/v1/chat/completions", body.clone())
    );
    assert_eq!((p.0.as_u16(), d.0.as_u16()), (200, 200), "{} {}", p.1, d.1);
    assert_eq!(d.1["usage"]["completion_tokens"], 2);
    // Absent is null too.
    let mut body = with_bootstrap(&chat_body(1), "127.0.0.1", Value::Null, json!(92));
    body.as_object_mut().unwrap().remove("bootstrap_port");
    let (p, d) = tokio::join!(
        prefill.post("/v1/chat/completions", body.clone()),
        decode.post("/v1/chat/completions", body)
    );
    assert_eq!((p.0.as_u16(), d.0.as_u16()), (200, 200), "{} {}", p.1, d.1);

    // A decode whose own port is elsewhere fails the same request.
    let other = start(SimConfig {
        disaggregation_bootstrap_port: closed_port().await,
        ..config(DisaggregationMode::Decode, SHORT_MS, 1)
    })
    .await;
    let body = with_bootstrap(&chat_body(1), "127.0.0.1", Value::Null, json!(93));
    decode_fails(&other, "/v1/chat/completions", body).await;
}

#[tokio::test]
async fn batches_use_one_room_per_item() {
    let p = pd(5000, 1).await;
    let body =
        json!({"text": ["first prompt", "second one"], "sampling_params": {"max_new_tokens": 2}});
    let b = with_bootstrap(
        &body,
        "127.0.0.1",
        json!([p.port, p.port]),
        json!([101, 102]),
    );
    let ((ps, pv), (ds, dv)) = p.send("/generate", b.clone(), b).await;
    assert_eq!((ps, ds), (200, 200), "{pv} {dv}");
    assert_eq!(pv[1]["text"], " tok0");
    assert_eq!(dv[0]["text"], " tok0 tok1");
    assert_eq!(dv[1]["index"], 1);
    assert_eq!(p.decode.stats().await["kv_fetched"], 2);

    // Token-id batches, streamed.
    let body = json!({"input_ids": [[1, 2, 3], [4, 5]], "stream": true,
                      "sampling_params": {"max_new_tokens": 1}});
    let (pre, dec) = p.pair_stream_batch(&body, [103, 104]).await;
    assert_eq!(pre.len(), 3, "{pre:?}");
    assert_eq!(dec.len(), 3, "{dec:?}");

    // Each item is checked against its own room: swapped rooms fail.
    let pd_short = pd(SHORT_MS, 1).await;
    let body = json!({"text": ["first prompt", "second one"]});
    let pre = with_bootstrap(&body, "127.0.0.1", json!(pd_short.port), json!([105, 106]));
    let dec = with_bootstrap(&body, "127.0.0.1", json!(pd_short.port), json!([106, 105]));
    let (_, (ds, dv)) = pd_short.send("/generate", pre, dec).await;
    assert_eq!(ds, 500, "{dv}");
}

impl Pd {
    /// [`Pd::pair_stream`] for a `/generate` batch with per-item rooms.
    async fn pair_stream_batch(&self, body: &Value, rooms: [u64; 2]) -> (Vec<Value>, Vec<Value>) {
        let b = with_bootstrap(body, "127.0.0.1", json!(self.port), json!(rooms));
        let s = b.to_string();
        let (p, d) = tokio::join!(
            self.prefill.post_raw("/generate", &s),
            self.decode.post_raw("/generate", &s)
        );
        let (p, d) = tokio::join!(p.text(), d.text());
        (sse_events(&p.unwrap()), sse_events(&d.unwrap()))
    }
}

#[tokio::test]
async fn seeds_ranks_follow_explicit_fields_or_the_room() {
    let p = pd_speaking(WireProfile::Legacy, 5000, 4).await;
    let body = json!({"text": "abcd", "sampling_params": {"max_new_tokens": 1}});
    // room % 4 == 2 on both sides.
    p.pair("/generate", &body, 4 * 1000 + 2).await;
    // Explicit ranks: data_parallel_rank on the prefill,
    // data_parallel_rank_decode on the decode (which ignores the first).
    let body = json!({"prompt": "abcd", "max_tokens": 1,
                      "data_parallel_rank": 1, "data_parallel_rank_decode": 3});
    p.pair("/v1/completions", &body, 4 * 1000 + 6).await;
    let ps = p.prefill.stats().await;
    let ds = p.decode.stats().await;
    assert_eq!(ps["by_rank"], json!([0, 1, 1, 0]), "{ps}");
    assert_eq!(ps["kv_fetched_by_rank"], json!([0, 1, 1, 0]), "{ps}");
    assert_eq!(ds["by_rank"], json!([0, 0, 1, 1]), "{ds}");
    assert_eq!(ds["kv_fetched_by_rank"], json!([0, 0, 1, 1]), "{ds}");
    // The request log says where each ran.
    assert_eq!(p.decode.ranks_run().await, [json!(2), json!(3)]);
}

#[tokio::test]
async fn logprobs_prompt_on_prefill_output_on_decode() {
    let p = pd(5000, 1).await;
    let body = json!({"input_ids": [5, 6, 7], "return_logprob": true,
                      "sampling_params": {"max_new_tokens": 2}});
    let (pre, dec) = p.pair("/generate", &body, 111).await;
    let input = pre["meta_info"]["input_token_logprobs"].as_array().unwrap();
    assert_eq!(input.len(), 3, "{pre}");
    assert_eq!(input[0], json!([null, 5, null]));
    assert_eq!(input[2][1], 7);
    assert!(input[2][0].as_f64().unwrap() < 0.0);
    assert_eq!(
        pre["meta_info"]["output_token_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(dec["meta_info"]["input_token_logprobs"], json!([]));
    let output = dec["meta_info"]["output_token_logprobs"]
        .as_array()
        .unwrap();
    assert_eq!(output.len(), 2);
    assert!(output[1][0].as_f64().unwrap() < 0.0);
    // Not asked, not sent.
    let body = json!({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 1}});
    let (pre, _) = p.pair("/generate", &body, 112).await;
    assert!(pre["meta_info"].get("input_token_logprobs").is_none());
    // Without disaggregation both come from the one worker.
    let (_, v) = start(fast())
        .await
        .post(
            "/generate",
            json!({"text": "abcdefgh", "return_logprob": true, "sampling_params": {"max_new_tokens": 3}}),
        )
        .await;
    assert_eq!(
        v["meta_info"]["input_token_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        v["meta_info"]["output_token_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

#[tokio::test]
async fn openai_logprobs_cover_generated_tokens() {
    let p = pd(5000, 1).await;
    let mut body = chat_body(3);
    body["logprobs"] = json!(true);
    let (pre, dec) = p.pair("/v1/chat/completions", &body, 131).await;
    let content = |v: &Value| {
        v["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .clone()
    };
    assert_eq!(content(&pre).len(), 1);
    let dec_lp = content(&dec);
    assert_eq!(dec_lp.len(), 3);
    assert_eq!(dec_lp[2]["token"], " tok2");
    assert_eq!(dec_lp[2]["bytes"], json!(" tok2".as_bytes()));
    // The prefill's first token is the decode's first token.
    assert_eq!(content(&pre)[0], dec_lp[0]);
    let (pre, _) = p.pair("/v1/chat/completions", &chat_body(1), 132).await;
    assert!(pre["choices"][0]["logprobs"].is_null());

    // Completions, streamed: one logprob per token chunk, the same numbers
    // /generate reports for the same prompt.
    let sim = start(fast()).await;
    let (_, gen) = sim
        .post(
            "/generate",
            json!({"text": "abcdefgh", "return_logprob": true, "sampling_params": {"max_new_tokens": 2}}),
        )
        .await;
    let expected: Vec<Value> = gen["meta_info"]["output_token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e[0].clone())
        .collect();
    let body = json!({"prompt": "abcdefgh", "max_tokens": 2, "logprobs": 0});
    let (_, v) = sim.post("/v1/completions", body.clone()).await;
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"], json!([" tok0", " tok1"]));
    assert_eq!(lp["text_offset"], json!([0, 5]));
    assert_eq!(lp["token_logprobs"], json!(expected));
    let mut body = body;
    body["stream"] = json!(true);
    let r = sim.post_raw("/v1/completions", &body.to_string()).await;
    let streamed: Vec<Value> = sse_events(&r.text().await.unwrap())
        .iter()
        .filter_map(|e| {
            e["choices"][0]["logprobs"]["token_logprobs"]
                .as_array()
                .cloned()
        })
        .flatten()
        .collect();
    assert_eq!(streamed, expected);
}

/// Current SGLang: a request runs on `routed_dp_rank`; the decode finds its
/// KV on prefill rank `disagg_prefill_dp_rank`; a prefill rank that
/// contradicts the room (room % dp_size) without that field fails.
#[tokio::test]
async fn upstream_ranks_follow_routed_and_disagg_prefill_fields() {
    let p = pd_speaking(WireProfile::Upstream, 5000, 4).await;
    let body = json!({"prompt": "abcd", "max_tokens": 1});
    // Prefill on rank 2 (room % 4 == 2 agrees), decode on rank 3 fetching
    // from prefill rank 2.
    let mut prefill = with_bootstrap(&body, "127.0.0.1", json!(p.port), json!(4 * 1000 + 2));
    prefill["routed_dp_rank"] = json!(2);
    let mut decode = prefill.clone();
    decode["routed_dp_rank"] = json!(3);
    decode["disagg_prefill_dp_rank"] = json!(2);
    let ((ps, pv), (ds, dv)) = p.send("/v1/completions", prefill, decode).await;
    assert_eq!((ps, ds), (200, 200), "{pv} {dv}");
    let (pst, dst) = (p.prefill.stats().await, p.decode.stats().await);
    assert_eq!(pst["by_rank"], json!([0, 0, 1, 0]), "{pst}");
    assert_eq!(dst["by_rank"], json!([0, 0, 0, 1]), "{dst}");
    // The KV came from prefill rank 2.
    assert_eq!(pst["kv_fetched_by_rank"], json!([0, 0, 1, 0]), "{pst}");
    // The seeds' decode field means nothing to current SGLang: the decode
    // runs on routed_dp_rank.
    let mut prefill = with_bootstrap(&body, "127.0.0.1", json!(p.port), json!(4 * 1000 + 1));
    prefill["routed_dp_rank"] = json!(1);
    let mut decode = prefill.clone();
    decode["data_parallel_rank_decode"] = json!(0);
    let ((ps, _), (ds, _)) = p.send("/v1/completions", prefill, decode).await;
    assert_eq!((ps, ds), (200, 200));
    assert_eq!(p.decode.stats().await["by_rank"], json!([0, 1, 0, 1]));
    // A prefill rank that contradicts the room fails the prefill.
    let mut prefill = with_bootstrap(&body, "127.0.0.1", json!(p.port), json!(4 * 1000 + 2));
    prefill["routed_dp_rank"] = json!(1);
    let (status, v) = p.prefill.post("/v1/completions", prefill).await;
    assert_eq!(status.as_u16(), 500, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("follow_bootstrap_room"),
        "{v}"
    );
}
