"""LoRA on a trained role (actor.lora, critic.lora).

    settings.py   LoraSettings: the `lora` keys
    adapters.py   add_adapters, adapter_state, base_state, merged_state, adapters_disabled, ...:
                  the adapters on the run's model and their tensors by name
    vision.py     a vision-language model's adapters: on its language model only (peft's target_modules as a
                  regular expression under model.language_model)
    export.py     save_lora_final: the final folder of a LoRA run (adapter, base, merged model)

Nothing is imported here: the strategy's config needs settings.py alone, without peft.
"""
