"""The `orders_enriched` view of the commerce DB: one row per order item, with its order's
payments and reviews aggregated into it, read through the order's index, so that a query that
keeps a few orders reads only theirs (every SQL answer the gateway scores runs on it)."""
from __future__ import annotations

import sqlite3

from common.commerce import VIEW, VIEW_COLUMNS

# the view's rows as first defined: items joined to their order's aggregates, each grouped whole
BY_GROUPED_JOINS = """
SELECT o.order_id, o.customer_id, c.customer_unique_id, c.customer_city, c.customer_state,
       o.order_status, o.order_purchase_timestamp, o.order_approved_at,
       o.order_delivered_customer_date, o.order_estimated_delivery_date,
       i.order_item_id, i.product_id, i.seller_id, i.price, i.freight_value,
       p.product_category_name, t.product_category_name_english,
       pay.payment_type, pay.payment_installments, pay.payment_value, r.review_score
FROM olist_orders_dataset o
JOIN olist_order_items_dataset i ON i.order_id = o.order_id
LEFT JOIN olist_products_dataset p ON p.product_id = i.product_id
LEFT JOIN product_category_name_translation t ON t.product_category_name = p.product_category_name
LEFT JOIN olist_customers_dataset c ON c.customer_id = o.customer_id
LEFT JOIN (SELECT order_id, MIN(payment_type) AS payment_type, MAX(payment_installments) AS payment_installments,
                  SUM(payment_value) AS payment_value
           FROM olist_order_payments_dataset GROUP BY order_id) pay ON pay.order_id = o.order_id
LEFT JOIN (SELECT order_id, MAX(review_score) AS review_score FROM olist_order_reviews_dataset GROUP BY order_id) r
       ON r.order_id = o.order_id"""


def test_the_view_holds_each_items_row_with_its_orders_payments_and_review(small_commerce_db):
    con = sqlite3.connect(f"file:{small_commerce_db}?mode=ro", uri=True)
    cursor = con.execute(f"SELECT * FROM {VIEW}")
    rows = cursor.fetchall()
    assert tuple(d[0] for d in cursor.description) == VIEW_COLUMNS
    assert sorted(rows, key=repr) == sorted(con.execute(BY_GROUPED_JOINS).fetchall(), key=repr)
    assert len(rows) == con.execute("SELECT COUNT(*) FROM olist_order_items_dataset").fetchone()[0]
    # orders with several payments and orders with none are both there, so the aggregates are tried
    assert con.execute("SELECT COUNT(*) FROM (SELECT order_id FROM olist_order_payments_dataset GROUP BY order_id HAVING COUNT(*) > 1)").fetchone()[0]
    assert any(row[VIEW_COLUMNS.index("review_score")] is None for row in rows)


def test_a_query_that_keeps_a_few_orders_reads_only_their_payments_and_reviews(small_commerce_db):
    con = sqlite3.connect(f"file:{small_commerce_db}?mode=ro", uri=True)
    category = con.execute("SELECT product_category_name FROM olist_products_dataset LIMIT 1").fetchone()[0]
    plan = " | ".join(row[3] for row in con.execute(
        f"EXPLAIN QUERY PLAN SELECT AVG(review_score), SUM(payment_value) FROM {VIEW} WHERE product_category_name = ?", (category,)))
    assert "MATERIALIZE" not in plan and "AUTOMATIC" not in plan, plan  # no table aggregated whole, no index built per query
    assert "idx_payments_order" in plan and "idx_reviews_order" in plan, plan
