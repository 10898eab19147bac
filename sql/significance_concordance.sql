-- significance, concordance with the original qrels (D-MERIT's agreement of conclusions).
-- Input: tested_pairs, the significance rows computed so far (one per measure, qrels version,
-- system pair, test; `significant` already decided on the Holm-corrected p-value).
--
-- A pair's conclusion under one qrels version:
--   'a'     significant and system_a's mean is higher,
--   'b'     significant and system_b's mean is higher,
--   'none'  no significant difference. Ties (equal means, or a p-value that is undefined
--           because the two systems' values are identical) are never significant: 'none'.
-- Each refined row (qrels_version <> 'original') is compared with the same pair, measure and
-- test on the original qrels:
--   agrees_with_original     its conclusion equals the original one (NULL on original rows,
--                            or when the pair has no original row);
--   concordance              share of the system pairs of its (measure, qrels version, test)
--                            that agree; a pair not significant on either side agrees (both
--                            conclude "no significant difference"), a pair significant on one
--                            side only disagrees, and so does a pair significant in opposite
--                            directions;
--   concordance_significant  the same share over the pairs significant on at least one side
--                            (agreement by shared silence left out); NULL when there is none.
with conclusions as (
    select *,
           case when significant and mean_a > mean_b then 'a'
                when significant and mean_b > mean_a then 'b'
                else 'none' end as conclusion
    from tested_pairs
),
versus as (
    select c.*,
           case when c.qrels_version <> 'original' then o.conclusion end as original_conclusion
    from conclusions c
    left join conclusions o
      on o.qrels_version = 'original' and o.measure = c.measure and o.test = c.test
     and o.system_a = c.system_a and o.system_b = c.system_b
)
select * exclude (original_conclusion),
       original_conclusion = conclusion as agrees_with_original,
       avg((original_conclusion = conclusion)::integer)
           over (partition by measure, qrels_version, test) as concordance,
       avg((original_conclusion = conclusion)::integer)
           filter (where conclusion <> 'none' or original_conclusion <> 'none')
           over (partition by measure, qrels_version, test) as concordance_significant
from versus
