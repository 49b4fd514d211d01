"""PersonaPlex's conversation prompt: the frames replayed into a call before it starts.

PersonaPlex conditions each call on a voice and a role by teacher-forcing, one frame per
step: the voice prompt (Mimi codes of a voice sample as the model's own audio, text PAD),
silence, the role text (one token per frame over silent model audio), silence; all the
while the user's side is a fixed "sine" frame. Every token of these frames is given, so
Cadence replays them as one parallel prefill of the temporal transformer (`MoshiLm.replay`).

    frames: int64 [P, streams]   stream order as the LM's: text, model audio, user audio

Timing follows Kyutai's `LMGen` convention: the live call's first user frame is read by the
step right after the prompt. (PersonaPlex's own `LMGen` reads each user frame one call
later, so its outputs are the same tokens one frame later.)
"""

import torch
from torch import Tensor

# Mimi codes of a silent frame and of PersonaPlex's "no user yet" frame, a 440 Hz sine of
# amplitude 0.5, under the released Mimi (2048 bins)
MIMI_BINS = 2048
SILENCE_CODES = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)
SINE_CODES = (430, 1268, 381, 1611, 1095, 1495, 56, 472)
SINE_HZ = 440.0
SINE_AMPLITUDE = 0.5
SILENCE_FRAMES = 6  # 0.5 s at 12.5 Hz, before and after the role text
SYSTEM_TAG = "<system>"  # PersonaPlex was trained on role texts between two of these


def system_tagged(role_text: str) -> str:
    """The role text as PersonaPlex saw its roles in training: "<system> ... <system>"
    (NVIDIA's own scripts add the tags; a text that has them already is kept)."""
    text = role_text.strip()
    if text.startswith(SYSTEM_TAG) and text.endswith(SYSTEM_TAG) and len(text) > len(SYSTEM_TAG):
        return text
    return f"{SYSTEM_TAG} {text} {SYSTEM_TAG}"


def personaplex_frames(
    voice_codes: Tensor,
    text_tokens: list[int],
    *,
    text_padding_id: int,
    silence_codes: tuple[int, ...] = SILENCE_CODES,
    sine_codes: tuple[int, ...] = SINE_CODES,
    silence_frames: int = SILENCE_FRAMES,
) -> Tensor:
    """voice_codes: int64 [V, 8] -> prompt frames int64 [V + 2 * silence + len(text), 17]."""
    audio = voice_codes.shape[1]
    if len(silence_codes) != audio or len(sine_codes) != audio:
        raise ValueError(f"silence and sine frames need {audio} codes each")
    silence = torch.tensor(silence_codes, dtype=torch.long)
    sine = torch.tensor(sine_codes, dtype=torch.long)
    rows: list[Tensor] = []

    def frame(text: int, model_audio: Tensor) -> None:
        rows.append(torch.cat([torch.tensor([text]), model_audio, sine]))

    for codes in voice_codes.to(torch.long):
        frame(text_padding_id, codes)
    for _ in range(silence_frames):
        frame(text_padding_id, silence)
    for token in text_tokens:
        frame(token, silence)
    for _ in range(silence_frames):
        frame(text_padding_id, silence)
    return torch.stack(rows)
