"""Text-to-SQL question patterns over the commerce DB: PT-BR questions (two phrasings each)
and their reference SQLite queries, from single-table counts to joins, group-bys, HAVING,
date filters and the `orders_enriched` view. `{uf}`, `{year}`, `{cat}`... are filled from the
values the DB actually holds, so every reference query returns rows.
"""
from __future__ import annotations

# (pattern id, question phrasings, reference SQL, parameter kinds)
Pattern = tuple[str, tuple[str, ...], str, tuple[str, ...]]
PATTERNS: tuple[Pattern, ...] = (
    ("count_orders", ("Quantos pedidos existem no total?", "Qual o número total de pedidos?"),
     "SELECT COUNT(*) FROM olist_orders_dataset", ()),
    ("count_status", ("Quantos pedidos estão com status {status}?", "Qual a quantidade de pedidos com status '{status}'?"),
     "SELECT COUNT(*) FROM olist_orders_dataset WHERE order_status = '{status}'", ("status",)),
    ("customers_state", ("Quantos clientes são do estado {uf}?", "Qual o número de clientes em {uf}?"),
     "SELECT COUNT(*) FROM olist_customers_dataset WHERE customer_state = '{uf}'", ("uf",)),
    ("unique_customers", ("Quantos clientes únicos a loja tem?", "Qual o número de clientes distintos (customer_unique_id)?"),
     "SELECT COUNT(DISTINCT customer_unique_id) FROM olist_customers_dataset", ()),
    ("sellers_state", ("Quantos vendedores estão no estado {uf}?", "Qual o número de vendedores em {uf}?"),
     "SELECT COUNT(*) FROM olist_sellers_dataset WHERE seller_state = '{uf}'", ("uf",)),
    ("products_cat", ("Quantos produtos existem na categoria {cat}?", "Qual a quantidade de produtos da categoria {cat}?"),
     "SELECT COUNT(*) FROM olist_products_dataset WHERE product_category_name = '{cat}'", ("cat",)),
    ("payments_total", ("Qual o valor total pago em todos os pedidos?", "Quanto somam todos os pagamentos?"),
     "SELECT SUM(payment_value) FROM olist_order_payments_dataset", ()),
    ("payment_avg_type", ("Qual o valor médio dos pagamentos com {ptype}?", "Quanto é, em média, um pagamento via {ptype}?"),
     "SELECT AVG(payment_value) FROM olist_order_payments_dataset WHERE payment_type = '{ptype}'", ("ptype",)),
    ("payment_count_type", ("Quantos pagamentos foram feitos com {ptype}?", "Qual o número de pagamentos do tipo {ptype}?"),
     "SELECT COUNT(*) FROM olist_order_payments_dataset WHERE payment_type = '{ptype}'", ("ptype",)),
    ("avg_installments", ("Qual a média de parcelas nos pagamentos com cartão de crédito?", "Em quantas parcelas, em média, se paga no cartão de crédito?"),
     "SELECT AVG(payment_installments) FROM olist_order_payments_dataset WHERE payment_type = 'credit_card'", ()),
    ("avg_review", ("Qual a nota média das avaliações?", "Qual a média do review_score?"),
     "SELECT AVG(review_score) FROM olist_order_reviews_dataset", ()),
    ("reviews_score", ("Quantas avaliações têm nota {score}?", "Qual o número de reviews com nota {score}?"),
     "SELECT COUNT(*) FROM olist_order_reviews_dataset WHERE review_score = {score}", ("score",)),
    ("orders_year", ("Quantos pedidos foram feitos em {year}?", "Qual o total de pedidos comprados no ano de {year}?"),
     "SELECT COUNT(*) FROM olist_orders_dataset WHERE strftime('%Y', order_purchase_timestamp) = '{year}'", ("year",)),
    ("orders_month", ("Quantos pedidos foram feitos em {month}/{year}?", "Qual o número de compras no mês {month} de {year}?"),
     "SELECT COUNT(*) FROM olist_orders_dataset WHERE strftime('%Y-%m', order_purchase_timestamp) = '{year}-{month}'", ("month",)),
    ("revenue_year", ("Qual o faturamento em produtos (soma dos preços) em {year}?", "Quanto foi vendido em preço de itens no ano {year}?"),
     "SELECT SUM(i.price) FROM olist_order_items_dataset i JOIN olist_orders_dataset o ON o.order_id = i.order_id "
     "WHERE strftime('%Y', o.order_purchase_timestamp) = '{year}'", ("year",)),
    ("top_states_customers", ("Quais os 5 estados com mais clientes?", "Liste os cinco estados com maior número de clientes."),
     "SELECT customer_state, COUNT(*) AS n FROM olist_customers_dataset GROUP BY customer_state ORDER BY n DESC LIMIT 5", ()),
    ("top_categories_items", ("Quais as 10 categorias com mais itens vendidos?", "Liste as dez categorias que mais venderam itens."),
     "SELECT p.product_category_name, COUNT(*) AS n FROM olist_order_items_dataset i JOIN olist_products_dataset p "
     "ON p.product_id = i.product_id GROUP BY p.product_category_name ORDER BY n DESC LIMIT 10", ()),
    ("orders_by_status", ("Quantos pedidos há por status?", "Mostre a contagem de pedidos para cada status."),
     "SELECT order_status, COUNT(*) FROM olist_orders_dataset GROUP BY order_status", ()),
    ("orders_by_month", ("Quantos pedidos foram feitos por mês em {year}?", "Mostre o número de pedidos mês a mês em {year}."),
     "SELECT strftime('%m', order_purchase_timestamp) AS mes, COUNT(*) FROM olist_orders_dataset "
     "WHERE strftime('%Y', order_purchase_timestamp) = '{year}' GROUP BY mes ORDER BY mes", ("year",)),
    ("ticket_by_state", ("Qual o ticket médio por estado do cliente?", "Qual o valor médio pago por pedido em cada estado?"),
     "SELECT c.customer_state, AVG(p.payment_value) FROM olist_order_payments_dataset p "
     "JOIN olist_orders_dataset o ON o.order_id = p.order_id JOIN olist_customers_dataset c ON c.customer_id = o.customer_id "
     "GROUP BY c.customer_state", ()),
    ("top_cities_state", ("Quais as 5 cidades com mais pedidos no estado {uf}?", "Liste as cinco cidades de {uf} que mais compraram."),
     "SELECT c.customer_city, COUNT(*) AS n FROM olist_orders_dataset o JOIN olist_customers_dataset c "
     "ON c.customer_id = o.customer_id WHERE c.customer_state = '{uf}' GROUP BY c.customer_city ORDER BY n DESC LIMIT 5", ("uf",)),
    ("avg_price_cat", ("Qual o preço médio dos itens da categoria {cat}?", "Quanto custa, em média, um item de {cat}?"),
     "SELECT AVG(i.price) FROM olist_order_items_dataset i JOIN olist_products_dataset p ON p.product_id = i.product_id "
     "WHERE p.product_category_name = '{cat}'", ("cat",)),
    ("freight_by_state", ("Qual o frete médio por estado do cliente?", "Quanto se paga de frete, em média, em cada estado?"),
     "SELECT c.customer_state, AVG(i.freight_value) FROM olist_order_items_dataset i "
     "JOIN olist_orders_dataset o ON o.order_id = i.order_id JOIN olist_customers_dataset c ON c.customer_id = o.customer_id "
     "GROUP BY c.customer_state", ()),
    ("late_count", ("Quantos pedidos foram entregues com atraso?", "Qual o número de pedidos entregues depois da data estimada?"),
     "SELECT COUNT(*) FROM olist_orders_dataset WHERE order_status = 'delivered' "
     "AND order_delivered_customer_date > order_estimated_delivery_date", ()),
    ("late_share", ("Qual a porcentagem de pedidos entregues com atraso?", "Que percentual das entregas atrasou?"),
     "SELECT 100.0 * SUM(order_delivered_customer_date > order_estimated_delivery_date) / COUNT(*) "
     "FROM olist_orders_dataset WHERE order_status = 'delivered'", ()),
    ("delivery_days", ("Qual o tempo médio de entrega em dias?", "Quantos dias, em média, leva uma entrega?"),
     "SELECT AVG(julianday(order_delivered_customer_date) - julianday(order_purchase_timestamp)) "
     "FROM olist_orders_dataset WHERE order_status = 'delivered'", ()),
    ("delivery_days_state", ("Qual o tempo médio de entrega em dias por estado?", "Quantos dias leva a entrega em cada estado, em média?"),
     "SELECT c.customer_state, AVG(julianday(o.order_delivered_customer_date) - julianday(o.order_purchase_timestamp)) "
     "FROM olist_orders_dataset o JOIN olist_customers_dataset c ON c.customer_id = o.customer_id "
     "WHERE o.order_status = 'delivered' GROUP BY c.customer_state", ()),
    ("review_by_cat", ("Qual a nota média das avaliações por categoria de produto?", "Como fica a média de review_score em cada categoria?"),
     "SELECT product_category_name, AVG(review_score) FROM orders_enriched WHERE review_score IS NOT NULL "
     "GROUP BY product_category_name", ()),
    ("top_sellers_revenue", ("Quais os 10 vendedores com maior faturamento?", "Liste os dez sellers que mais faturaram."),
     "SELECT seller_id, SUM(price) AS total FROM olist_order_items_dataset GROUP BY seller_id ORDER BY total DESC LIMIT 10", ()),
    ("count_sellers", ("Quantos vendedores existem?", "Qual o número total de vendedores cadastrados?"),
     "SELECT COUNT(*) FROM olist_sellers_dataset", ()),
    ("max_price", ("Qual o maior preço de item vendido?", "Qual foi o item mais caro já vendido?"),
     "SELECT MAX(price) FROM olist_order_items_dataset", ()),
    ("top_products", ("Quais os 5 produtos mais vendidos?", "Liste os cinco product_id com mais itens vendidos."),
     "SELECT product_id, COUNT(*) AS n FROM olist_order_items_dataset GROUP BY product_id ORDER BY n DESC LIMIT 5", ()),
    ("payment_distribution", ("Como se distribuem os pagamentos por tipo?", "Quantos pagamentos há de cada tipo de pagamento?"),
     "SELECT payment_type, COUNT(*) FROM olist_order_payments_dataset GROUP BY payment_type", ()),
    ("multi_item_orders", ("Quantos pedidos têm mais de um item?", "Qual o número de pedidos com vários itens?"),
     "SELECT COUNT(*) FROM (SELECT order_id FROM olist_order_items_dataset GROUP BY order_id HAVING COUNT(*) > 1)", ()),
    ("items_per_order", ("Qual a média de itens por pedido?", "Quantos itens tem um pedido, em média?"),
     "SELECT AVG(n) FROM (SELECT COUNT(*) AS n FROM olist_order_items_dataset GROUP BY order_id)", ()),
    ("reviews_with_text", ("Quantas avaliações têm comentário escrito?", "Qual o número de reviews com mensagem de texto?"),
     "SELECT COUNT(*) FROM olist_order_reviews_dataset WHERE review_comment_message IS NOT NULL", ()),
    ("review_late", ("Qual a nota média das avaliações de pedidos entregues com atraso?", "Que nota dão, em média, os clientes cujo pedido atrasou?"),
     "SELECT AVG(r.review_score) FROM olist_order_reviews_dataset r JOIN olist_orders_dataset o ON o.order_id = r.order_id "
     "WHERE o.order_delivered_customer_date > o.order_estimated_delivery_date", ()),
    ("states_low_review", ("Quais estados têm nota média de avaliação abaixo de {threshold}?", "Em que estados a média das notas fica abaixo de {threshold}?"),
     "SELECT customer_state, AVG(review_score) AS media FROM orders_enriched GROUP BY customer_state HAVING media < {threshold}", ("threshold",)),
    ("revenue_by_cat_en", ("Quais as 10 categorias (em inglês) com maior faturamento?", "Liste as dez categorias, com nome em inglês, que mais faturaram."),
     "SELECT t.product_category_name_english, SUM(i.price) AS total FROM olist_order_items_dataset i "
     "JOIN olist_products_dataset p ON p.product_id = i.product_id "
     "JOIN product_category_name_translation t ON t.product_category_name = p.product_category_name "
     "GROUP BY t.product_category_name_english ORDER BY total DESC LIMIT 10", ()),
    ("freight_year", ("Qual o valor total de frete em {year}?", "Quanto se pagou de frete no ano de {year}?"),
     "SELECT SUM(i.freight_value) FROM olist_order_items_dataset i JOIN olist_orders_dataset o ON o.order_id = i.order_id "
     "WHERE strftime('%Y', o.order_purchase_timestamp) = '{year}'", ("year",)),
    ("canceled_year", ("Quantos pedidos foram cancelados em {year}?", "Qual o número de cancelamentos em {year}?"),
     "SELECT COUNT(*) FROM olist_orders_dataset WHERE order_status = 'canceled' "
     "AND strftime('%Y', order_purchase_timestamp) = '{year}'", ("year",)),
    ("top_states_revenue", ("Quais os 5 estados com maior faturamento?", "Liste os cinco estados que mais geraram receita em pagamentos."),
     "SELECT c.customer_state, SUM(p.payment_value) AS total FROM olist_order_payments_dataset p "
     "JOIN olist_orders_dataset o ON o.order_id = p.order_id JOIN olist_customers_dataset c ON c.customer_id = o.customer_id "
     "GROUP BY c.customer_state ORDER BY total DESC LIMIT 5", ()),
    ("weight_cat", ("Qual o peso médio dos produtos da categoria {cat}?", "Quanto pesa, em gramas, um produto de {cat} em média?"),
     "SELECT AVG(product_weight_g) FROM olist_products_dataset WHERE product_category_name = '{cat}'", ("cat",)),
    ("installments_over", ("Quantos pagamentos foram parcelados em mais de {k} vezes?", "Qual o número de pagamentos com mais de {k} parcelas?"),
     "SELECT COUNT(*) FROM olist_order_payments_dataset WHERE payment_installments > {k}", ("k",)),
    ("monthly_revenue_view", ("Qual o faturamento mensal em {year}?", "Mostre a receita de itens mês a mês em {year}."),
     "SELECT strftime('%m', order_purchase_timestamp) AS mes, SUM(price) FROM orders_enriched "
     "WHERE strftime('%Y', order_purchase_timestamp) = '{year}' GROUP BY mes ORDER BY mes", ("year",)),
    ("city_most_sellers", ("Qual a cidade com mais vendedores?", "Em que cidade estão mais sellers?"),
     "SELECT seller_city, COUNT(*) AS n FROM olist_sellers_dataset GROUP BY seller_city ORDER BY n DESC LIMIT 1", ()),
    ("repeat_customers", ("Quantos clientes compraram mais de uma vez?", "Qual o número de clientes com mais de um pedido?"),
     "SELECT COUNT(*) FROM (SELECT customer_unique_id FROM olist_customers_dataset GROUP BY customer_unique_id HAVING COUNT(*) > 1)", ()),
    ("orders_state_year", ("Quantos pedidos de clientes de {uf} foram feitos em {year}?", "Qual o número de compras vindas de {uf} em {year}?"),
     "SELECT COUNT(*) FROM olist_orders_dataset o JOIN olist_customers_dataset c ON c.customer_id = o.customer_id "
     "WHERE c.customer_state = '{uf}' AND strftime('%Y', o.order_purchase_timestamp) = '{year}'", ("uf", "year")),
    ("revenue_payment_type", ("Qual o faturamento por tipo de pagamento?", "Quanto foi pago em cada forma de pagamento?"),
     "SELECT payment_type, SUM(payment_value) FROM olist_order_payments_dataset GROUP BY payment_type", ()),
    ("cat_translation", ("Qual o nome em inglês da categoria {cat}?", "Como se chama em inglês a categoria {cat}?"),
     "SELECT product_category_name_english FROM product_category_name_translation WHERE product_category_name = '{cat}'", ("cat",)),
    ("latest_orders", ("Quais os 10 pedidos mais recentes?", "Liste os dez últimos pedidos feitos, do mais novo ao mais antigo."),
     "SELECT order_id, order_purchase_timestamp FROM olist_orders_dataset ORDER BY order_purchase_timestamp DESC LIMIT 10", ()),
)

# General questions that join tables, each with parameters, so the bootstrap reads many of them: the
# joins above take none and give the bootstrap one row each, and its SFT on 200 single-table rows
# and 18 joins left a model that asks the orders table for `customer_state` whatever the prompt
# says (docs/results.md, 2026-12-07). They join what the team's questions join (items to products,
# orders to customers, items to orders) and ask other things of it. Drawn with their own random
# stream, so the rows drawn before them and after them, every task's team rows included, stay the same.
JOIN_PATTERNS: tuple[Pattern, ...] = (
    ("items_cat", ("Quantos itens da categoria {cat} foram vendidos?", "Qual o número de itens vendidos da categoria {cat}?"),
     "SELECT COUNT(*) FROM olist_order_items_dataset i JOIN olist_products_dataset p ON p.product_id = i.product_id "
     "WHERE p.product_category_name = '{cat}'", ("cat",)),
    ("revenue_cat", ("Quanto faturaram os itens da categoria {cat}?", "Qual a receita total dos itens de {cat}?"),
     "SELECT SUM(i.price) FROM olist_order_items_dataset i JOIN olist_products_dataset p ON p.product_id = i.product_id "
     "WHERE p.product_category_name = '{cat}'", ("cat",)),
    ("sellers_cat", ("Quantos vendedores diferentes venderam itens de {cat}?", "Qual o número de vendedores distintos da categoria {cat}?"),
     "SELECT COUNT(DISTINCT i.seller_id) FROM olist_order_items_dataset i JOIN olist_products_dataset p "
     "ON p.product_id = i.product_id WHERE p.product_category_name = '{cat}'", ("cat",)),
    ("orders_state_status", ("Quantos pedidos de clientes de {uf} estão com status {status}?",
                             "Qual o número de pedidos com status '{status}' feitos por clientes do estado {uf}?"),
     "SELECT COUNT(*) FROM olist_orders_dataset o JOIN olist_customers_dataset c ON c.customer_id = o.customer_id "
     "WHERE c.customer_state = '{uf}' AND o.order_status = '{status}'", ("uf", "status")),
    ("items_year", ("Quantos itens foram vendidos em {year}?", "Qual o número de itens vendidos no ano de {year}?"),
     "SELECT COUNT(*) FROM olist_order_items_dataset i JOIN olist_orders_dataset o ON o.order_id = i.order_id "
     "WHERE strftime('%Y', o.order_purchase_timestamp) = '{year}'", ("year",)),
    ("avg_price_year", ("Qual o preço médio dos itens vendidos em {year}?", "Quanto custou, em média, um item vendido em {year}?"),
     "SELECT AVG(i.price) FROM olist_order_items_dataset i JOIN olist_orders_dataset o ON o.order_id = i.order_id "
     "WHERE strftime('%Y', o.order_purchase_timestamp) = '{year}'", ("year",)),
    ("review_state", ("Qual a nota média das avaliações de clientes de {uf}?", "Em média, que nota dão os clientes do estado {uf}?"),
     "SELECT AVG(r.review_score) FROM olist_order_reviews_dataset r JOIN olist_orders_dataset o ON o.order_id = r.order_id "
     "JOIN olist_customers_dataset c ON c.customer_id = o.customer_id WHERE c.customer_state = '{uf}'", ("uf",)),
    ("paid_state", ("Quanto pagaram, no total, os clientes de {uf}?", "Qual o valor total pago por clientes do estado {uf}?"),
     "SELECT SUM(pay.payment_value) FROM olist_order_payments_dataset pay JOIN olist_orders_dataset o ON o.order_id = pay.order_id "
     "JOIN olist_customers_dataset c ON c.customer_id = o.customer_id WHERE c.customer_state = '{uf}'", ("uf",)),
    ("top_cats_state", ("Quais as {k} categorias mais vendidas para clientes de {uf}?",
                        "Liste as {k} categorias com mais itens comprados por clientes de {uf}."),
     "SELECT p.product_category_name, COUNT(*) AS n FROM olist_order_items_dataset i JOIN olist_products_dataset p "
     "ON p.product_id = i.product_id JOIN olist_orders_dataset o ON o.order_id = i.order_id JOIN olist_customers_dataset c "
     "ON c.customer_id = o.customer_id WHERE c.customer_state = '{uf}' GROUP BY p.product_category_name ORDER BY n DESC LIMIT {k}",
     ("k", "uf")),
)
# The demo store's own questions: patterns the bootstrap's supervised data never shows the model
# (each with parameters, so the team's traffic and the held-out rows ask them with other values).
# The general patterns teach the pieces (year filters, joins, category filters, grouping).
TEAM_PATTERNS = frozenset({
    "orders_state_year", "avg_price_cat", "weight_cat", "installments_over", "freight_year", "canceled_year",
    "top_cities_state", "states_low_review", "monthly_revenue_view", "reviews_score",
})
assert {pattern[0] for pattern in PATTERNS} >= TEAM_PATTERNS
assert not {pattern[0] for pattern in JOIN_PATTERNS} & {pattern[0] for pattern in PATTERNS}

PAYMENT_TYPE_WORDS = {"credit_card": "cartão de crédito", "boleto": "boleto", "voucher": "voucher", "debit_card": "cartão de débito"}
