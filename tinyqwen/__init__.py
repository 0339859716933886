"""What both backends train on, owned by neither: the generated arithmetic task and its verl-schema
splits (`task`, `data`), the tokenizer trained on it (`tokenizer`) and the Qwen2/Qwen3 model builders
(`models`). `localrl` and `verlrun` import it; it imports neither."""
