"""rlgrad's instruments inside a plain PyTorch loop with its own loss: REINFORCE with a group baseline.

Nothing of rlgrad's trainer is used: the loop builds its batches, computes its own per-token loss and
steps its own optimizer; at step 1 it asks the instruments what its gradient is made of.
    python examples/custom_loop.py
"""
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlgrad.algos.advantages import broadcast_to_tokens, group_reward_std, grpo_advantages
from rlgrad.algos.objective import per_token_loss
from rlgrad.analysis import analyse_buckets, analyse_components
from rlgrad.batch import Batch


def token_logp(model, batch):  # log π(token t | tokens < t), at column t
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(logp, (1, 0))


def reinforce(model, batch):  # the loop's own per-token loss, zero off the response tokens
    return {"task": -batch.advantages * token_logp(model, batch) * batch.response_mask}


def make_batch(groups=6, n=4, prompt=6, response=5):  # a stand-in for rollouts: rewards from the tokens
    ids = torch.randint(1, 64, (groups * n, prompt + response))
    mask = torch.zeros(ids.shape)
    mask[:, prompt:] = 1
    gids = torch.arange(groups).repeat_interleave(n)
    correct, fmt = (ids[:, -1] % 2 == 0).float(), (ids[:, prompt] < 32).float()
    scores = 0.8 * correct + 0.2 * fmt
    adv = broadcast_to_tokens(grpo_advantages(scores, gids, norm_by_std=True), mask)
    return Batch(
        input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=mask, group_ids=gids, scores=scores,
        reward_std=group_reward_std(scores, gids), components={"correctness": correct, "format": fmt}, advantages=adv)


def main(steps=3):
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(1, steps + 1):
        batch = make_batch()
        if step == 1:  # look inside the update before taking it
            buckets = analyse_buckets(model, batch, per_token_loss(reinforce, "token-mean"), num_buckets=3)
            unit = per_token_loss(lambda m, b: -token_logp(m, b) * b.response_mask, "token-mean")
            comps = analyse_components(model, batch, unit, weights={"correctness": 0.8, "format": 0.2})
            print({k: round(v, 4) for k, v in {**buckets.metrics, **comps.metrics}.items()
                   if k.count("/") == 2 and k.endswith("/task") or k.startswith("grad_sim/")})
        loss = reinforce(model, batch)["task"].sum() / batch.response_mask.sum()  # token-mean
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
