# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "trl-groupopt",
#     "trl[vllm]>=1.16,<1.17",
# ]
# ///
"""Train with DFPOTrainer: in-group re-weighting of GSPO's sequence ratios (Min-Replace, Orth-Proj, exact QP) and GRPO-fix.

The script is TRL's GRPO example with one class changed: `TrlParser((ScriptArguments, DFPOConfig, ModelConfig))`,
so every GRPOConfig / ModelConfig flag works, and `--config examples/configs/dfpo.yaml` reads a YAML file.

Offline demo (no model argument: the embedded tiny policy on the synthetic arithmetic task, CPU, no Hub):

    accelerate launch examples/train_dfpo.py
    accelerate launch examples/train_dfpo.py --max_steps 3 --use_peft --lora_r 8 --lora_target_modules q_proj v_proj

Two CPU processes (DDP over gloo; `accelerate launch --cpu --num_processes 2` would start only one):

    torchrun --nproc_per_node 2 examples/train_dfpo.py

It prints the held-out greedy accuracy before and after, a progress bar and one line per log step (reward, sampled
accuracy, loss, the method's headline metric), and leaves in outputs/dfpo-demo the model, its card (README.md),
trainer_state.json, results.json and reward_accuracy.png. `--help` lists every option (with the method's own).

Your data, from a local file (.jsonl .json .parquet .csv) or the Hub, read as an explicit --dataset_format
(prompt-answer: columns prompt, solution; gsm8k; math):

    accelerate launch examples/train_dfpo.py --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \
        --dataset_name my_data.jsonl --dataset_format prompt-answer --max_completion_length 256

With on-policy data every GSPO ratio s_i is exactly 1 and every transform is the identity (DFPO = GSPO):
the demo defaults are off-policy (steps_per_generation=4 > gradient_accumulation_steps=2). DFPO needs whole groups
in each micro-batch: per_device_train_batch_size must be a multiple of num_generations.

Single GPU, Qwen2.5-0.5B-Instruct on GSM8K:

    accelerate launch --config_file examples/accelerate_configs/single_gpu.yaml examples/train_dfpo.py \
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name openai/gsm8k --dataset_config main --dataset_format gsm8k \
        --output_dir Qwen2.5-0.5B-DFPO --learning_rate 1e-6 --bf16 --per_device_train_batch_size 8 \
        --num_generations 8 --max_completion_length 512 --dfpo_transform min_replace   # or orth_proj | orth_proj_qp | none (GSPO) | symmetric_clip (GRPO-fix)

Multi-GPU (8 processes, DDP):

    accelerate launch --config_file examples/accelerate_configs/multi_gpu.yaml examples/train_dfpo.py \
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name openai/gsm8k --dataset_config main --dataset_format gsm8k \
        --output_dir Qwen2.5-0.5B-DFPO --bf16 --learning_rate 1e-6 --per_device_train_batch_size 8

DeepSpeed ZeRO-2:

    accelerate launch --config_file examples/accelerate_configs/deepspeed_zero2.yaml examples/train_dfpo.py \
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name openai/gsm8k --dataset_config main --dataset_format gsm8k \
        --output_dir Qwen2.5-0.5B-DFPO --bf16 --learning_rate 1e-6 --per_device_train_batch_size 8

DeepSpeed ZeRO-3:

    accelerate launch --config_file examples/accelerate_configs/deepspeed_zero3.yaml examples/train_dfpo.py \
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name openai/gsm8k --dataset_config main --dataset_format gsm8k \
        --output_dir Qwen2.5-0.5B-DFPO --bf16 --learning_rate 1e-6 --per_device_train_batch_size 8

FSDP2:

    accelerate launch --config_file examples/accelerate_configs/fsdp2.yaml examples/train_dfpo.py \
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name openai/gsm8k --dataset_config main --dataset_format gsm8k \
        --output_dir Qwen2.5-0.5B-DFPO --bf16 --learning_rate 1e-6 --per_device_train_batch_size 8

vLLM in colocate mode with LoRA (generation shares the training GPUs; TRL's importance-sampling correction of the
vLLM/trainer mismatch is applied on top of the objective):

    accelerate launch --config_file examples/accelerate_configs/single_gpu.yaml examples/train_dfpo.py \
        --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --dataset_name openai/gsm8k --dataset_config main --dataset_format gsm8k \
        --output_dir Qwen2.5-0.5B-DFPO-LoRA --bf16 --learning_rate 1e-5 \
        --use_vllm --vllm_mode colocate --vllm_gpu_memory_utilization 0.3 --vllm_enable_sleep_mode \
        --use_peft --lora_r 16 --lora_alpha 32 --lora_target_modules q_proj k_proj v_proj o_proj \
        --push_to_hub
"""

from trl_groupopt.cli.main import command

if __name__ == "__main__":
    command("dfpo")  # train("dfpo") with errors as one line (--debug: the traceback)
