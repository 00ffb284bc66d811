"""Token F1, LoCoMo per-category F1, BLEU-1 and the offline lexical judge.

Expected values are derived by hand from the official definitions (snap-research/locomo
``task_eval/evaluation.py``; nltk BLEU with weights (1, 0, 0, 0)); the derivation is in each comment.
"""

import math

import pytest

from aml_ray.scoring import (
    OFFLINE_JUDGE_NAME,
    bleu1,
    lexical_verdict,
    locomo_f1,
    multi_answer_f1,
    normalize_answer,
    stemmed_tokens,
    token_f1,
)


# --- normalisation ---------------------------------------------------------------------------------


def test_normalize_deletes_commas_punctuation_articles_and_and():
    # commas deleted, lowercased, '-' and '!' deleted (not spaced), a/the/and removed, spaces collapsed
    assert normalize_answer("The Quick, Brown-Fox and a dog!") == "quick brownfox dog"


def test_normalize_keeps_article_letters_inside_words():
    # \b word boundaries: "another", "theme", "band" keep their letters
    assert normalize_answer("Another theme band") == "another theme band"


def test_normalize_reads_combining_marks_as_word_characters_as_the_official_regex():
    # task_eval/evaluation.py removes articles with the regex module, whose \b treats a combining mark as part
    # of the word: "a" + U+0301 and "an" + U+0301 are words of their own, not articles, and differ (F1 0.0)
    assert normalize_answer("a\u0301") == "a\u0301"
    assert normalize_answer("an\u0301 apple") == "an\u0301 apple"
    assert token_f1("a\u0301", "an\u0301") == 0.0


def test_normalize_date_forms():
    assert normalize_answer("May 7, 2023.") == "may 7 2023"
    assert normalize_answer("7 May 2023") == "7 may 2023"


def test_normalize_renders_numbers_and_none():
    assert normalize_answer(3) == "3"
    assert normalize_answer(None) == ""


def test_stemmed_tokens_use_porter():
    # Porter: cats->cat, running->run, mentions->mention; "the" removed by normalisation
    assert stemmed_tokens("The cats running mentions") == ["cat", "run", "mention"]


# --- token F1 --------------------------------------------------------------------------------------


def test_token_f1_trailing_punctuation_is_exact():
    assert token_f1("Paris.", "Paris") == 1.0


def test_token_f1_date_word_order_does_not_matter():
    # both sides become the multiset {may, 7, 2023}
    assert token_f1("May 7, 2023.", "7 May 2023") == 1.0


def test_token_f1_partial_overlap_with_stemming():
    # pred "cat is running" -> [cat, is, run]; gold "cats ran" -> [cat, ran]; overlap 1
    # P = 1/3, R = 1/2, F1 = 2*(1/6)/(5/6) = 0.4
    assert token_f1("The cat is running", "cats ran") == pytest.approx(0.4)


def test_token_f1_counts_repeats_as_multiset():
    # pred [dog, dog, dog], gold [dog, cat]: overlap min(3, 1) = 1; P = 1/3, R = 1/2 -> 0.4
    assert token_f1("dog dog dog", "dog cat") == pytest.approx(0.4)


def test_token_f1_extra_words_lower_precision():
    # pred [in, 2023] vs gold [2023]: P = 1/2, R = 1 -> F1 = 2/3
    assert token_f1("in 2023", "2023") == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [("", "Paris"), ("Paris", ""), ("", ""), ("the", "a"), (None, "Paris"), ("London", "Paris")],
)
def test_token_f1_is_zero_without_overlap_or_tokens(prediction, gold):
    assert token_f1(prediction, gold) == 0.0


def test_token_f1_returns_python_float():
    assert type(token_f1("Paris", "Paris")) is float


# --- LoCoMo per-category F1 ------------------------------------------------------------------------


def test_category_1_splits_gold_and_prediction_on_commas():
    assert locomo_f1("London, Paris", "Paris, London", "1") == 1.0


def test_category_1_averages_over_gold_parts():
    # gold parts [Paris, London]; pred parts [Paris]: best F1 1.0 and 0.0 -> mean 0.5
    assert locomo_f1("Paris", "Paris, London", "1") == pytest.approx(0.5)


def test_category_1_unsplit_prediction_scores_each_gold_part():
    # pred "London and Paris" -> [london, paris]; against "Paris": P = 1/2, R = 1 -> 2/3;
    # against "London" the same -> mean 2/3
    assert locomo_f1("London and Paris", "Paris, London", "1") == pytest.approx(2 / 3)


def test_category_1_differs_from_plain_token_f1():
    # plain token F1: pred [paris] vs gold [paris, london] -> P = 1, R = 1/2 -> 2/3, not 0.5
    assert token_f1("Paris", "Paris, London") == pytest.approx(2 / 3)
    assert multi_answer_f1("Paris", "Paris, London") == pytest.approx(0.5)


def test_category_3_cuts_gold_at_semicolon():
    # gold cut to "Likely yes" -> [like, ye]; pred [ye]: P = 1, R = 1/2 -> 2/3
    gold = "Likely yes; she mentions liking the outdoors"
    assert locomo_f1("yes", gold, "3") == pytest.approx(2 / 3)
    # without the cut the gold has 6 tokens [like, ye, she, mention, like, outdoor]: R = 1/6 -> 2/7
    assert token_f1("yes", gold) == pytest.approx(2 / 7)


@pytest.mark.parametrize("category", ["2", "4"])
def test_categories_2_and_4_use_token_f1(category):
    assert locomo_f1("May 7, 2023.", "7 May 2023", category) == 1.0
    assert locomo_f1("The cat is running", "cats ran", category) == pytest.approx(0.4)


def test_category_4_does_not_split_on_commas():
    # token F1 over the whole gold: 2/3 (see above), not the category-1 mean 0.5
    assert locomo_f1("Paris", "Paris, London", "4") == pytest.approx(2 / 3)


def test_int_gold_is_compared_as_text():
    assert locomo_f1("3", 3, "4") == 1.0
    # pred [in, 2023] vs gold "2023" -> 2/3
    assert locomo_f1("in 2023", 2023, "2") == pytest.approx(2 / 3)


def test_list_gold_takes_best_acceptable_answer():
    golds = ["Paris", "the capital of France"]
    assert locomo_f1("Paris", golds, "4") == 1.0
    # "capital of France" vs "capital of france" (the removed) -> 1.0; vs "Paris" -> 0
    assert locomo_f1("capital of France", golds, "4") == 1.0
    # pred [capit] vs [capit, of, franc]: P = 1, R = 1/3 -> 0.5
    assert locomo_f1("capital", golds, "2") == pytest.approx(0.5)


def test_list_gold_with_category_1_and_3_rules():
    assert locomo_f1("Paris", ["Rome, Oslo", "Paris, London"], "1") == pytest.approx(0.5)
    assert locomo_f1("yes", ["no; never", "yes; probably"], "3") == 1.0


def test_category_5_checks_abstention_phrases():
    assert locomo_f1("No information available.", None, "5") == 1.0
    assert locomo_f1("That is not mentioned in the conversation", "anything", "5") == 1.0
    assert locomo_f1("Paris", "Paris", "5") == 0.0


def test_category_accepts_int_and_rejects_unknown():
    assert locomo_f1("Paris", "Paris", 4) == 1.0
    with pytest.raises(ValueError, match="expected one of 1, 2, 3, 4, 5"):
        locomo_f1("Paris", "Paris", "6")


def test_missing_gold_raises_for_scored_categories():
    with pytest.raises(ValueError, match="None"):
        locomo_f1("Paris", None, "4")
    with pytest.raises(ValueError, match="empty"):
        locomo_f1("Paris", [], "4")


# --- BLEU-1 ----------------------------------------------------------------------------------------


def test_bleu1_identical_strings_is_one():
    assert bleu1("The cat sat on the mat", "The cat sat on the mat") == pytest.approx(1.0)


def test_bleu1_ignores_case_and_punctuation():
    assert bleu1("Paris.", "paris") == pytest.approx(1.0)


def test_bleu1_short_prediction_pays_brevity_penalty():
    # pred [the, cat, sat] (c = 3), gold 6 tokens (r = 6); clipped unigram precision 3/3 = 1
    # BP = exp(1 - r/c) = exp(1 - 2) = exp(-1) = 0.367879...
    assert bleu1("the cat sat", "the cat sat on the mat") == pytest.approx(math.exp(-1))


def test_bleu1_long_prediction_clipped_precision():
    # pred [the, dog, sat, on, the, mat, today] (c = 7 > r = 6, BP = 1);
    # clipped matches: the 2 (gold has 2), sat 1, on 1, mat 1 -> 5/7
    assert bleu1("The dog sat on the mat today.", "the cat sat on the mat") == pytest.approx(5 / 7)


def test_bleu1_no_overlap_and_empty_prediction_are_zero():
    assert bleu1("London", "Paris") == 0.0
    assert bleu1("", "Paris") == 0.0
    assert bleu1("...", "Paris") == 0.0
    assert bleu1(None, "Paris") == 0.0


def test_bleu1_int_gold_and_float_result():
    score = bleu1("3", 3)
    assert type(score) is float and score == pytest.approx(1.0)


# --- offline lexical judge -------------------------------------------------------------------------


def test_offline_judge_name_says_not_official():
    assert OFFLINE_JUDGE_NAME == "offline-lexical-judge (not an official model)"


def test_lexical_judge_correct_by_f1():
    verdict, rationale = lexical_verdict("Paris.", "Paris")
    assert verdict == "CORRECT"
    assert "F1 1.000" in rationale


def test_lexical_judge_f1_threshold_is_inclusive():
    # pred [capit] vs gold [capit, of, franc] -> F1 0.5 exactly -> CORRECT
    assert lexical_verdict("capital", "capital of France")[0] == "CORRECT"
    # pred [the, cat, is, run] -> [cat, is, run] vs [cat, ran]: F1 0.4 and no containment -> WRONG
    assert lexical_verdict("The cat is running", "cats ran")[0] == "WRONG"


def test_lexical_judge_correct_by_containment_despite_low_f1():
    # pred has 11 tokens, overlap 3: P = 3/11, R = 1 -> F1 = 6/14 = 0.43 < 0.5, but the gold is contained
    prediction = "She went on 7 May 2023 to the lake with her family"
    assert token_f1(prediction, "7 May 2023") == pytest.approx(6 / 14)
    verdict, rationale = lexical_verdict(prediction, "7 May 2023")
    assert verdict == "CORRECT"
    assert "appears in the prediction" in rationale


def test_lexical_judge_containment_respects_word_boundaries():
    # "1" is not contained in "10 times"; F1 0 -> WRONG
    assert lexical_verdict("10 times", 1)[0] == "WRONG"


def test_lexical_judge_wrong_and_rationale():
    verdict, rationale = lexical_verdict("London", "Paris")
    assert verdict == "WRONG"
    assert "0.000" in rationale and "'paris'" in rationale


def test_lexical_judge_list_gold_any_correct():
    assert lexical_verdict("Paris", ["Rome", "Paris"])[0] == "CORRECT"
    assert lexical_verdict("Oslo", ["Rome", "Paris"])[0] == "WRONG"


def test_lexical_judge_empty_prediction_is_wrong():
    assert lexical_verdict("", "Paris")[0] == "WRONG"
    assert lexical_verdict(None, "Paris")[0] == "WRONG"
